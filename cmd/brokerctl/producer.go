package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

var expiryActions = map[string]txmqv1.ExpiryAction{
	"park":     txmqv1.ExpiryAction_EXPIRY_ACTION_PARK,
	"rollback": txmqv1.ExpiryAction_EXPIRY_ACTION_ROLLBACK,
}

// callbackPrefixes are how a producer group's callback URL may start.
var callbackPrefixes = []string{"http://", "https://", "grpc://"}

func runProducerList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	group := fs.String("group", "", "only this producer `group`")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListProducers, &txmqv1.ListProducersRequest{ProducerGroup: *group})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		for _, p := range resp.GetInstances() {
			if err := c.printJSON(newProducerJSON(p)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "PRODUCER-GROUP\tINSTANCE\tENDPOINT\tREGISTERED\tLAST-HEARTBEAT\tLEASE-EXPIRES")
	for _, p := range resp.GetInstances() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.GetProducerGroup(), p.GetInstanceId(), orDash(endpointText(p.GetEndpoint())),
			tableTime(p.GetRegisteredAt()), tableTime(p.GetLastHeartbeat()), tableTime(p.GetLeaseExpiresAt()))
	}
	return tw.Flush()
}

// producerFlags are group config's settings of a producer group's
// check-back policy.
type producerFlags struct {
	maxChecks       *uint
	checkBackoff    *time.Duration
	maxCheckBackoff *time.Duration
	maxHalfAge      *time.Duration
	expiry          *string
	callback        *string
}

func addProducerFlags(fs *flag.FlagSet) *producerFlags {
	return &producerFlags{
		maxChecks:       fs.Uint("max-checks", 0, "producer group: `N` check-backs that reached a producer before a message expires, at least 1 (default: the broker's, 15)"),
		checkBackoff:    fs.Duration("check-backoff", 0, "producer group: delay after the first unanswered check-back; doubles after each one (default: the broker's, 6s)"),
		maxCheckBackoff: fs.Duration("max-check-backoff", 0, "producer group: cap of that delay (default: the broker's, 1m)"),
		maxHalfAge:      fs.Duration("max-half-age", 0, "producer group: a half message older than this expires whatever its checks (default: the broker's, 24h)"),
		expiry:          fs.String("expiry", "", "producer group: `action` for a half message whose checks are used up or that is too old: park (keep it EXPIRED for an operator; the broker's default) or rollback"),
		callback:        fs.String("callback", "", "producer group: `URL` asked when no instance of the group is registered: http://, https:// or grpc://host:port; \"\" clears it"),
	}
}

// config returns the settings given on the command line for group, or nil
// when none was. An invalid value is a usage error.
func (f *producerFlags) config(c *cli, fs *flag.FlagSet, group string) (*txmqv1.ProducerGroupConfig, error) {
	given := func(name string) bool { return flagGiven(fs, name) }
	cfg := &txmqv1.ProducerGroupConfig{ProducerGroup: group}
	change := false
	if given("max-checks") {
		if *f.maxChecks < 1 || *f.maxChecks > math.MaxUint32 {
			return nil, c.usageError(fs, "--max-checks must be between 1 and %d, not %d", uint32(math.MaxUint32), *f.maxChecks)
		}
		cfg.MaxChecks = proto.Uint32(uint32(*f.maxChecks))
		change = true
	}
	for _, d := range []struct {
		name  string
		value time.Duration
		field **durationpb.Duration
	}{
		{"check-backoff", *f.checkBackoff, &cfg.CheckBackoff},
		{"max-check-backoff", *f.maxCheckBackoff, &cfg.MaxCheckBackoff},
		{"max-half-age", *f.maxHalfAge, &cfg.MaxHalfAge},
	} {
		if !given(d.name) {
			continue
		}
		if d.value <= 0 {
			return nil, c.usageError(fs, "--%s must be positive, not %s", d.name, d.value)
		}
		*d.field = durationpb.New(d.value)
		change = true
	}
	if given("check-backoff") && given("max-check-backoff") && *f.checkBackoff > *f.maxCheckBackoff {
		return nil, c.usageError(fs, "--check-backoff (%s) must not be above --max-check-backoff (%s)", *f.checkBackoff, *f.maxCheckBackoff)
	}
	if given("expiry") {
		action, ok := expiryActions[enumKey(*f.expiry)]
		if !ok {
			return nil, c.usageError(fs, "--expiry must be park or rollback, not %q", *f.expiry)
		}
		cfg.ExpiryAction = action
		change = true
	}
	if given("callback") {
		if err := checkCallbackURL(*f.callback); err != nil {
			return nil, c.usageError(fs, "--callback %q: %v", *f.callback, err)
		}
		cfg.CallbackUrl = proto.String(*f.callback)
		change = true
	}
	if !change {
		return nil, nil
	}
	return cfg, nil
}

// producerConfigFields are the lines of a producer group's check-back
// policy, the first, its name, labelled label.
func producerConfigFields(label string, cfg *txmqv1.ProducerGroupConfig) [][2]string {
	maxChecks := "-"
	if cfg != nil && cfg.MaxChecks != nil {
		maxChecks = strconv.FormatUint(uint64(cfg.GetMaxChecks()), 10)
	}
	return [][2]string{
		{label, cfg.GetProducerGroup()},
		{"Max checks", maxChecks},
		{"Check backoff", tableDuration(cfg.GetCheckBackoff())},
		{"Max check backoff", tableDuration(cfg.GetMaxCheckBackoff())},
		{"Max half age", tableDuration(cfg.GetMaxHalfAge())},
		{"Expiry action", orDash(expiryName(cfg.GetExpiryAction()))},
		{"Callback URL", orDash(cfg.GetCallbackUrl())},
	}
}

// checkCallbackURL accepts "" (no callback), an http:// or https:// URL with
// a host, and grpc://host:port.
func checkCallbackURL(s string) error {
	if s == "" {
		return nil
	}
	if !slices.ContainsFunc(callbackPrefixes, func(p string) bool { return strings.HasPrefix(s, p) }) {
		return errors.New(`want an http://, https:// or grpc:// URL, or "" to clear it`)
	}
	u, err := url.Parse(s)
	if uerr := (*url.Error)(nil); errors.As(err, &uerr) {
		err = uerr.Err
	}
	switch {
	case err != nil:
		return err
	case u.Host == "":
		return errors.New("the URL has no host")
	case u.Scheme == "grpc":
		if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" || u.Path != "" {
			return errors.New("want grpc://host:port")
		}
	}
	return nil
}
