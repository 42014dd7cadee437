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
	fmt.Fprintln(tw, "GROUP\tINSTANCE\tENDPOINT\tREGISTERED\tLAST HEARTBEAT\tLEASE EXPIRES")
	for _, p := range resp.GetInstances() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", p.GetProducerGroup(), p.GetInstanceId(), orDash(endpointText(p.GetEndpoint())),
			tableTime(p.GetRegisteredAt()), tableTime(p.GetLastHeartbeat()), tableTime(p.GetLeaseExpiresAt()))
	}
	return tw.Flush()
}

// runGroupConfig shows a producer group's check-back policy, or, when any
// setting flag is given, changes exactly those settings and shows the result.
func runGroupConfig(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	maxChecks := fs.Uint("max-checks", 0, "`N` check-backs that reached a producer before a message expires, at least 1 (default: the broker's, 15)")
	checkBackoff := fs.Duration("check-backoff", 0, "delay after the first unanswered check-back; doubles after each one (default: the broker's, 6s)")
	maxCheckBackoff := fs.Duration("max-check-backoff", 0, "cap of that delay (default: the broker's, 1m)")
	maxHalfAge := fs.Duration("max-half-age", 0, "a half message older than this expires whatever its checks (default: the broker's, 24h)")
	expiry := fs.String("expiry", "", "`action` for a half message whose checks are used up or that is too old: park (keep it EXPIRED for an operator; the broker's default) or rollback")
	callback := fs.String("callback", "", "`URL` asked when no instance of the group is registered: http://, https:// or grpc://host:port; \"\" clears it")
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	given := func(name string) bool { return flagGiven(fs, name) }

	cfg := &txmqv1.ProducerGroupConfig{ProducerGroup: pos[0]}
	change := false
	if given("max-checks") {
		if *maxChecks < 1 || *maxChecks > math.MaxUint32 {
			return c.usageError(fs, "--max-checks must be between 1 and %d, not %d", uint32(math.MaxUint32), *maxChecks)
		}
		cfg.MaxChecks = proto.Uint32(uint32(*maxChecks))
		change = true
	}
	for _, d := range []struct {
		name  string
		value time.Duration
		field **durationpb.Duration
	}{
		{"check-backoff", *checkBackoff, &cfg.CheckBackoff},
		{"max-check-backoff", *maxCheckBackoff, &cfg.MaxCheckBackoff},
		{"max-half-age", *maxHalfAge, &cfg.MaxHalfAge},
	} {
		if !given(d.name) {
			continue
		}
		if d.value <= 0 {
			return c.usageError(fs, "--%s must be positive, not %s", d.name, d.value)
		}
		*d.field = durationpb.New(d.value)
		change = true
	}
	if given("check-backoff") && given("max-check-backoff") && *checkBackoff > *maxCheckBackoff {
		return c.usageError(fs, "--check-backoff (%s) must not be above --max-check-backoff (%s)", *checkBackoff, *maxCheckBackoff)
	}
	if given("expiry") {
		action, ok := expiryActions[*expiry]
		if !ok {
			return c.usageError(fs, "--expiry must be park or rollback, not %q", *expiry)
		}
		cfg.ExpiryAction = action
		change = true
	}
	if given("callback") {
		if err := checkCallbackURL(*callback); err != nil {
			return c.usageError(fs, "--callback %q: %v", *callback, err)
		}
		cfg.CallbackUrl = proto.String(*callback)
		change = true
	}

	var result *txmqv1.ProducerGroupConfig
	if change {
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.SetProducerGroupConfig, &txmqv1.SetProducerGroupConfigRequest{Config: cfg})
		if err != nil {
			return err
		}
		result = resp.GetConfig()
	} else {
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetProducerGroupConfig, &txmqv1.GetProducerGroupConfigRequest{ProducerGroup: pos[0]})
		if err != nil {
			return err
		}
		result = resp.GetConfig()
	}
	if c.jsonOutput() {
		return c.printJSON(newGroupConfigJSON(result))
	}
	maxChecksText := "-"
	if result.MaxChecks != nil {
		maxChecksText = strconv.FormatUint(uint64(result.GetMaxChecks()), 10)
	}
	return printFields(c.stdout, [][2]string{
		{"Producer group", result.GetProducerGroup()},
		{"Max checks", maxChecksText},
		{"Check backoff", tableDuration(result.GetCheckBackoff())},
		{"Max check backoff", tableDuration(result.GetMaxCheckBackoff())},
		{"Max half age", tableDuration(result.GetMaxHalfAge())},
		{"Expiry action", orDash(expiryName(result.GetExpiryAction()))},
		{"Callback URL", orDash(result.GetCallbackUrl())},
	})
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
