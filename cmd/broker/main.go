// Command broker runs one txmq node. With no flags it starts a single-node
// cluster with its data in ./txmq-data, serving gRPC on 127.0.0.1:7420.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/internal/bounds"
	"github.com/txmq/txmq/internal/buildinfo"
	"github.com/txmq/txmq/raftlog"
)

func main() {
	os.Exit(run(os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr))
}

// run is the broker without the process around it: env reads the TXMQ_*
// variables. It returns the exit code: 2 for a usage error.
func run(args []string, env func(string) (string, bool), stdout, stderr io.Writer) int {
	fs, v := newFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *v.version {
		fmt.Fprintln(stdout, buildinfo.Get().Line("broker"))
		return 0
	}
	if err := applySources(fs, env); err != nil {
		fmt.Fprintf(stderr, "broker: %v\n", err)
		return 2
	}
	cfg, err := v.config(fs, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "broker: %v\n", err)
		return 2
	}
	v.auth.apply(&cfg)
	var pprofLis net.Listener
	if *v.pprof != "" {
		if pprofLis, err = listenLoopback(*v.pprof); err != nil {
			fmt.Fprintf(stderr, "broker: --pprof-listen: %v\n", err)
			return 2
		}
		defer pprofLis.Close()
	}
	rmqLis, err := v.rocketmq.open(&cfg, *v.tls.insecure)
	if err != nil {
		fmt.Fprintf(stderr, "broker: %v\n", err)
		return 2
	}
	if rmqLis != nil {
		defer rmqLis.Close()
	}
	return serve(cfg, v, pprofLis, rmqLis, stdout, stderr)
}

// handOverTimeout bounds the leadership transfer a stopping leader makes.
const handOverTimeout = 10 * time.Second

// flagValues are the broker's flags, as newFlagSet defines them. Every one
// can also be set in the --config file and by a TXMQ_* variable
// (config.go).
type flagValues struct {
	data, listen, raftListen, raftAdv, nodeID, join, peers, grpcAdv, metricsAddr *string
	redeliver, expiry, logFormat, logLevel, pprof, configFile, logStore          *string
	bootstrap, autoCreate, version, syncLeader                                   *bool
	retBytes                                                                     *uint64
	ackDeadline, retention, retInterval, dedupWindow, checkAfter                 *time.Duration
	checkBackoff, maxBackoff, maxHalfAge, checkTimeout, snapInterval             *time.Duration
	clockOffset                                                                  *time.Duration
	bootIDFile                                                                   *string
	maxDeliver, maxChecks                                                        *uint32
	maxMsg, checksAll, checksGroup                                               *int
	snapThresh                                                                   *uint64
	auth                                                                         *authFlags
	rocketmq                                                                     *rocketmqFlags
	tls                                                                          *tlsFlags
}

// newFlagSet defines the broker's flags.
func newFlagSet(stderr io.Writer) (*flag.FlagSet, *flagValues) {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs, &flagValues{
		configFile:   fs.String(configFlag, "", "YAML file of settings: each key is a flag name; the command line and TXMQ_* variables win over it (env TXMQ_CONFIG)"),
		version:      fs.Bool("version", false, "print the version and exit"),
		data:         fs.String("data", "txmq-data", "data directory (created if missing)"),
		listen:       fs.String("listen", broker.DefaultGRPCAddr, "gRPC listen address"),
		raftListen:   fs.String("raft-listen", broker.DefaultRaftAddr, "Raft listen address"),
		raftAdv:      fs.String("raft-advertise", "", "Raft address other nodes dial (default: the bound --raft-listen address)"),
		nodeID:       fs.String("node-id", "n1", "this node's ID in the Raft cluster"),
		bootstrap:    fs.Bool("bootstrap", true, "start a new cluster (of this node, or of --peers) if the data directory has no Raft state; off with --join"),
		join:         fs.String("join", "", "comma-separated gRPC addresses of cluster members to join through (never bootstraps)"),
		peers:        fs.String("peers", "", "static cluster: comma-separated id=raft-address for every node, this one included"),
		grpcAdv:      fs.String("grpc-advertise", "", "gRPC address clients and other nodes reach this node at (default: the bound --listen address)"),
		metricsAddr:  fs.String("metrics-listen", broker.DefaultMetricsAddr, "HTTP address of /metrics, /healthz and /readyz; empty turns it off"),
		ackDeadline:  bounded(fs, "ack-deadline", broker.DefaultAckDeadline, bounds.AckDeadline, "redeliver a delivery not acked within this time"),
		maxDeliver:   bounded(fs, "max-deliveries", uint32(broker.DefaultMaxDeliveries), bounds.MaxDeliveries, "deliveries of a message before it moves to its group's dead-letter queue (a group may set its own)"),
		redeliver:    fs.String("redelivery-backoff", durationList(broker.DefaultRedeliveryBackoff()), "comma-separated delays before redelivery after the 1st, 2nd, ... failure; the last repeats"),
		retention:    bounded(fs, "retention", broker.DefaultRetention, bounds.Retention, "committed messages older than this are dropped, consumed or not"),
		retBytes:     fs.Uint64("retention-bytes", 0, "per topic: drop the oldest messages while the log is larger than this; 0: no size limit"),
		retInterval:  bounded(fs, "retention-interval", broker.DefaultRetentionInterval, bounds.RetentionInterval, "how often the leader drops expired messages and prunes resolved half messages and dedup keys"),
		autoCreate:   fs.Bool("auto-create-topics", true, "create topics on their first message or subscription, and consumer groups on their first subscription (false: brokerctl topic create and group create first)"),
		dedupWindow:  bounded(fs, "dedup-window", broker.DefaultDedupWindow, bounds.DedupWindow, "a Send repeating a key within this window returns the first message ID; 0 turns dedup off"),
		maxMsg:       bounded(fs, "max-message-size", broker.DefaultMaxMessage, bounds.MessageSize, "largest message body in bytes"),
		checkAfter:   bounded(fs, "check-after", broker.DefaultCheckAfter, bounds.CheckAfter, "default delay before the first check-back of a half message"),
		maxChecks:    bounded(fs, "max-checks", uint32(checkback.DefaultMaxChecks), bounds.MaxChecks, "check-backs that reach a producer before a half message expires"),
		checkBackoff: bounded(fs, "check-backoff", checkback.DefaultBackoff, bounds.CheckBackoff, "delay after an unanswered check-back; doubles each time"),
		maxBackoff:   bounded(fs, "max-check-backoff", checkback.DefaultMaxBackoff, bounds.MaxCheckBackoff, "cap of the check-back delay"),
		maxHalfAge:   bounded(fs, "max-half-age", checkback.DefaultMaxHalfAge, bounds.MaxHalfAge, "a half message older than this expires"),
		expiry:       fs.String("expiry-action", "park", "what expiry does: park (keep for an operator) or rollback"),
		checkTimeout: bounded(fs, "check-timeout", checkback.DefaultCallTimeout, bounds.CallTimeout, "time a producer has to answer one check-back"),
		checksAll:    bounded(fs, "check-concurrency", checkback.DefaultMaxConcurrent, bounds.Concurrency, "check-backs in flight at once"),
		checksGroup:  bounded(fs, "check-concurrency-per-group", checkback.DefaultMaxPerGroup, bounds.Concurrency, "check-backs in flight at once for one producer group"),
		snapInterval: bounded(fs, "snapshot-interval", raftlog.DefaultSnapshotInterval, bounds.SnapshotInterval, "how often to consider taking a Raft snapshot"),
		snapThresh:   bounded(fs, "snapshot-threshold", uint64(raftlog.DefaultSnapshotThreshold), bounds.SnapshotThreshold, "log entries since the last snapshot that trigger a new one"),
		logStore:     fs.String("raft-log-store", raftlog.LogStoreWAL, "the Raft log's store: wal (segments, one fdatasync per append) or bolt (raft.db, raft-boltdb; a bolt node started with wal migrates)"),
		syncLeader:   fs.Bool("raft-sync-leader-append", false, "the Raft leader fsyncs each append before it replicates it (hashicorp/raft's order, slower); by default the wal's leader syncs behind its appends while they replicate, and applies nothing before they are durable"),
		logFormat:    fs.String("log-format", "text", "log format: text or json"),
		logLevel:     fs.String("log-level", "info", "log level: debug, info, warn, error"),
		tls:          newTLSFlags(fs),
		pprof:        fs.String("pprof-listen", "", "serve net/http/pprof on this loopback address (e.g. 127.0.0.1:6060); empty (the default) turns it off"),
		auth:         newAuthFlags(fs),
		rocketmq:     newRocketMQFlags(fs),
		clockOffset:  fs.Duration("clock-offset", 0, "testing only (the fault suite's clock fault): run the broker's clock this far ahead (or behind, negative) of the machine's"),
		bootIDFile:   fs.String("boot-id-file", "", "testing only (the fault suite's power cut): read the machine's boot ID from this file instead of the kernel's; a new ID there makes the broker take its start for a reboot after a power cut and rebuild fsm.db"),
	}
}

// config turns the parsed flags into the broker's configuration; an error
// is a usage error.
func (v *flagValues) config(fs *flag.FlagSet, stderr io.Writer) (broker.Config, error) {
	if fs.NArg() > 0 {
		return broker.Config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	logger, err := newLogger(stderr, *v.logFormat, *v.logLevel)
	if err != nil {
		return broker.Config{}, err
	}
	if *v.logStore != raftlog.LogStoreWAL && *v.logStore != raftlog.LogStoreBolt {
		return broker.Config{}, fmt.Errorf("--raft-log-store %q: use %s or %s", *v.logStore, raftlog.LogStoreWAL, raftlog.LogStoreBolt)
	}
	if *v.expiry != "park" && *v.expiry != "rollback" {
		return broker.Config{}, fmt.Errorf("--expiry-action %q: use park or rollback", *v.expiry)
	}
	backoff, err := parseDurations(*v.redeliver)
	if err != nil {
		return broker.Config{}, fmt.Errorf("--redelivery-backoff: %w", err)
	}
	peerList, err := parsePeers(*v.peers)
	if err != nil {
		return broker.Config{}, fmt.Errorf("--peers: %w", err)
	}
	var joinAddrs []string
	if *v.join != "" {
		joinAddrs = strings.Split(*v.join, ",")
		// A node that joins never starts a cluster of its own.
		*v.bootstrap = false
	}
	dir, err := filepath.Abs(*v.data)
	if err != nil {
		return broker.Config{}, fmt.Errorf("--data: %w", err)
	}
	if *v.dedupWindow == 0 {
		*v.dedupWindow = broker.Disabled
	}
	cfg := broker.Config{
		Raft: raftlog.Config{
			NodeID:            *v.nodeID,
			Dir:               dir,
			LogStore:          *v.logStore,
			SyncLeaderAppend:  *v.syncLeader,
			BootIDFile:        *v.bootIDFile,
			RaftAddr:          *v.raftListen,
			AdvertiseAddr:     *v.raftAdv,
			Bootstrap:         *v.bootstrap,
			Peers:             peerList,
			SnapshotInterval:  *v.snapInterval,
			SnapshotThreshold: *v.snapThresh,
		},
		GRPCAddr:          *v.listen,
		GRPCAdvertise:     *v.grpcAdv,
		MetricsAddr:       *v.metricsAddr,
		Join:              joinAddrs,
		AckDeadline:       *v.ackDeadline,
		MaxDeliveries:     *v.maxDeliver,
		RedeliveryBackoff: backoff,
		Retention:         *v.retention,
		RetentionBytes:    *v.retBytes,
		RetentionInterval: *v.retInterval,
		AutoCreateTopics:  v.autoCreate,
		DedupWindow:       *v.dedupWindow,
		MaxMessageSize:    *v.maxMsg,
		DefaultCheckAfter: *v.checkAfter,
		CheckBack: checkback.Config{
			Policy: checkback.Policy{
				MaxChecks:  *v.maxChecks,
				Backoff:    *v.checkBackoff,
				MaxBackoff: *v.maxBackoff,
				MaxHalfAge: *v.maxHalfAge,
				Rollback:   *v.expiry == "rollback",
			},
			CallTimeout:   *v.checkTimeout,
			MaxConcurrent: *v.checksAll,
			MaxPerGroup:   *v.checksGroup,
		},
		Logger: logger,
	}
	if off := *v.clockOffset; off != 0 {
		cfg.Now = func() time.Time { return time.Now().Add(off) }
	}
	return cfg, v.tls.configure(&cfg)
}

// serve runs the broker (and, with rmqLis, its RocketMQ front end) until
// SIGINT or SIGTERM, reading the certificate files of the TLS flags again
// when they change.
func serve(cfg broker.Config, v *flagValues, pprofLis, rmqLis net.Listener, stdout, stderr io.Writer) int {
	tf := v.tls
	logger := cfg.Logger
	b, err := broker.Open(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "broker: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "txmq broker %s: gRPC on %s, Raft on %s, data in %s\n", cfg.Raft.NodeID, b.Addr(), b.Node().RaftAddr(), cfg.Raft.Dir)
	if b.MetricsAddr() != "" {
		fmt.Fprintf(stdout, "metrics on http://%s/metrics, health on /healthz and /readyz\n", b.MetricsAddr())
	}
	rmq, err := serveRocketMQ(rmqLis, b, logger)
	if err != nil {
		b.Close()
		fmt.Fprintf(stderr, "broker: %v\n", err)
		return 1
	}
	if rmq != nil {
		fmt.Fprintf(stdout, "RocketMQ remoting (name server and broker) on %s\n", rmq.Addr())
	}
	if pprofLis != nil {
		go servePprof(pprofLis, logger)
		fmt.Fprintf(stdout, "pprof on http://%s/debug/pprof/\n", pprofLis.Addr())
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go reloadOnHUP(ctx, b)
	tf.watch(ctx, logger)
	readyCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	if err := b.WaitReady(readyCtx); err != nil && !errors.Is(ctx.Err(), context.Canceled) {
		logger.Warn("no leader yet", "err", err)
	} else if err == nil {
		leader, _ := b.Node().Leader()
		fmt.Fprintf(stdout, "ready: leader is %s\n", leader)
	}
	cancel()
	<-ctx.Done()
	logger.Info("shutting down")
	if rmq != nil {
		rmq.Close()
	}
	hctx, cancel := context.WithTimeout(context.Background(), handOverTimeout)
	if err := b.HandOver(hctx); err != nil {
		logger.Warn("leadership not handed over; the others elect a leader after an election timeout", "err", err)
	}
	cancel()
	if err := b.Close(); err != nil {
		fmt.Fprintf(stderr, "broker: close: %v\n", err)
		return 1
	}
	return 0
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", format)
}

// parsePeers reads "n1=127.0.0.1:7421,n2=127.0.0.1:7431".
func parsePeers(s string) ([]raftlog.Peer, error) {
	if s == "" {
		return nil, nil
	}
	var out []raftlog.Peer
	for _, p := range strings.Split(s, ",") {
		id, addr, ok := strings.Cut(p, "=")
		if !ok || id == "" || addr == "" {
			return nil, fmt.Errorf("%q is not id=raft-address", p)
		}
		out = append(out, raftlog.Peer{ID: id, RaftAddr: addr})
	}
	return out, nil
}

// bounded defines a flag whose value must lie in r: a value outside is a
// usage error, as the admin API refuses it, instead of a zero that would
// silently mean the default.
func bounded[T interface {
	time.Duration | uint32 | uint64 | int
}](fs *flag.FlagSet, name string, def T, r bounds.Range[T], usage string) *T {
	v := def
	fs.Func(name, fmt.Sprintf("%s (%v..%v, default %v)", usage, r.Min, r.Max, def), func(s string) error {
		x, err := parseFlag[T](s)
		if err != nil {
			return err
		}
		if err := r.Check("--"+name, x); err != nil {
			return err
		}
		v = x
		return nil
	})
	return &v
}

func parseFlag[T interface {
	time.Duration | uint32 | uint64 | int
}](s string) (T, error) {
	var zero T
	switch any(zero).(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		return T(d), err
	case uint32:
		n, err := strconv.ParseUint(s, 10, 32)
		return T(n), err
	case uint64:
		n, err := strconv.ParseUint(s, 10, 64)
		return T(n), err
	}
	n, err := strconv.Atoi(s)
	return T(n), err
}

// durationList formats durations as --redelivery-backoff takes them.
func durationList(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.String()
	}
	return strings.Join(parts, ",")
}

// parseDurations reads a comma-separated list of durations.
func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, part := range strings.Split(s, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", part, err)
		}
		out = append(out, d)
	}
	return out, nil
}
