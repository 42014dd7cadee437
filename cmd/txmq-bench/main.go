// Command txmq-bench measures txmq: full transactions per second, their
// latencies, commit-to-consumer latency at a fixed rate, check-back
// throughput, and writes over a large backlog. It starts a fresh cluster
// of broker processes (or brokers in its own process, or uses --addr) for
// each run, on loopback, and prints a table or JSON lines.
//
//	txmq-bench                                  # every workload, 3 broker processes
//	txmq-bench --workloads tx --producers 1,16 -o json
//
// See docs/benchmarks.md for what each workload does and the figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/buildinfo"
)

func main() {
	if os.Getenv(echoEnv) != "" {
		os.Exit(echo(os.Stdout, os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

var allWorkloads = []string{"tx", "tx-oneway", "send", "e2e", "checkback", "backlog"}

type options struct {
	workloads        []string
	nodes            int
	producers        []int
	e2eProducers     int
	oneProducer      bool
	consumers        int
	size             int
	duration, warmup time.Duration
	rate             float64
	localTx          time.Duration
	orphans          int
	backlogPending   int
	backlogCommitted int
	addr             string
	inProcess        bool
	brokerBin        string
	brokerPprof      bool
	dir              string
	keep             bool
	output           string
	breakdown        bool
	cpuprofile       string
	memprofile       string
	version          bool
	tls              bool
	auth             bool
	rounds           int

	log io.Writer // progress
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{log: stderr}
	fs := flag.NewFlagSet("txmq-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	workloads := fs.String("workloads", strings.Join(allWorkloads, ","), "comma-separated workloads: "+strings.Join(allWorkloads, ", "))
	producers := fs.String("producers", "1,16", "comma-separated producer counts; tx, tx-oneway and send run once for each, backlog uses the largest")
	fs.IntVar(&o.nodes, "nodes", 3, "cluster size: 1 or 3")
	fs.IntVar(&o.e2eProducers, "e2e-producers", 16, "producer clients the e2e workers share")
	fs.BoolVar(&o.oneProducer, "one-producer", false, "tx, tx-oneway, send and backlog: the producers are goroutines sharing one Producer (one connection, one session), as a service's handlers would, instead of a Producer each")
	fs.IntVar(&o.consumers, "consumers", 1, "consumers in the group that acks every message")
	fs.IntVar(&o.size, "size", 256, "message body size in bytes (at least 8)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time of each run")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "time each run works before it measures")
	fs.Float64Var(&o.rate, "rate", 2000, "e2e: scheduled transactions per second")
	fs.DurationVar(&o.localTx, "local-tx", 0, "tx, tx-oneway and backlog: how long each producer waits between SendHalf and Commit, as its local database transaction would")
	fs.IntVar(&o.orphans, "orphans", 10_000, "checkback: half messages left pending for check-back")
	fs.IntVar(&o.backlogPending, "backlog-pending", 200_000, "backlog: pending half messages seeded (the issue's full size: 1000000)")
	fs.IntVar(&o.backlogCommitted, "backlog-committed", 1_000_000, "backlog: committed messages seeded (the issue's full size: 10000000)")
	fs.StringVar(&o.addr, "addr", "", "comma-separated gRPC addresses of a running cluster to use instead of starting one (no CPU/RSS figures, no backlog)")
	fs.BoolVar(&o.inProcess, "inprocess", false, "run the brokers in this process (broker.Open) instead of as broker processes")
	fs.StringVar(&o.brokerBin, "broker-bin", "", "broker binary for the processes (default: go build ./cmd/broker into --dir)")
	fs.BoolVar(&o.brokerPprof, "broker-pprof", false, "start the broker processes with --pprof-listen on free loopback ports, printed at start")
	fs.StringVar(&o.dir, "dir", "", "where the nodes' data goes (default: a new temporary directory, removed at the end)")
	fs.BoolVar(&o.keep, "keep", false, "keep the data directory")
	fs.StringVar(&o.output, "o", "table", "output: table or json (one object per line, latencies in µs)")
	fs.BoolVar(&o.breakdown, "breakdown", false, "scrape every node's /metrics before and after the measured window and print where the writes' time went, stage by stage, beside the client's latencies")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write the bench process's CPU profile here (with --inprocess it includes the brokers)")
	fs.StringVar(&o.memprofile, "memprofile", "", "write the bench process's heap profile here at the end")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVar(&o.tls, "tls", false, "run the workloads twice in this session: in plaintext, then over TLS (client certificates required, mutual TLS between the nodes; throwaway certificates in --dir)")
	fs.BoolVar(&o.auth, "auth", false, "run the workloads twice in this session: without auth, then with an auth file (a principal with a bcrypt token hash and rules for the bench's topics and groups; the clients send the token); with --tls, the second run has both")
	fs.IntVar(&o.rounds, "rounds", 1, "with --tls or --auth: run off then on this many times, interleaved, so that a change in the machine's load shows in both")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.version {
		return o, nil
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.workloads = strings.Split(*workloads, ",")
	for _, w := range o.workloads {
		if !slices.Contains(allWorkloads, w) {
			return nil, fmt.Errorf("--workloads: unknown workload %q", w)
		}
	}
	for _, s := range strings.Split(*producers, ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--producers: %q is not a positive number", s)
		}
		o.producers = append(o.producers, n)
	}
	switch {
	case o.nodes != 1 && o.nodes != 3:
		return nil, fmt.Errorf("--nodes %d: use 1 or 3", o.nodes)
	case o.size < 8:
		return nil, fmt.Errorf("--size %d: at least 8 bytes (the bench's timestamp)", o.size)
	case o.consumers < 1 || o.e2eProducers < 1:
		return nil, errors.New("--consumers and --e2e-producers must be at least 1")
	case o.duration <= 0 || o.warmup < 0 || o.localTx < 0:
		return nil, errors.New("--duration must be positive, --warmup and --local-tx not negative")
	case o.rate <= 0:
		return nil, fmt.Errorf("--rate %g must be positive", o.rate)
	case o.orphans < 1 || o.backlogPending < 0 || o.backlogCommitted < 0:
		return nil, errors.New("--orphans must be at least 1, the backlog sizes not negative")
	case o.output != "table" && o.output != "json":
		return nil, fmt.Errorf("-o %q: use table or json", o.output)
	case o.addr != "" && slices.Contains(o.workloads, "backlog"):
		return nil, errors.New("backlog seeds the brokers' data directories, so it cannot run with --addr")
	case o.addr != "" && (o.tls || o.auth):
		return nil, errors.New("--tls and --auth start brokers with certificates and an auth file of their own, so they cannot run with --addr")
	case o.rounds < 1:
		return nil, fmt.Errorf("--rounds %d: at least 1", o.rounds)
	case o.addr != "" && o.breakdown:
		return nil, errors.New("--breakdown scrapes the /metrics of the nodes the bench starts, so it cannot run with --addr")
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(stderr, "txmq-bench: %v\n", err)
		}
		return 2
	}
	if o.version {
		fmt.Fprintln(stdout, buildinfo.Get().Line("txmq-bench"))
		return 0
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "txmq-bench: %v\n", err)
		return 1
	}
	return 0
}

func bench(ctx context.Context, o *options, stdout io.Writer) error {
	cleanup, err := prepareDir(o)
	if err != nil {
		return err
	}
	defer cleanup()
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.memprofile != "" {
		defer writeHeapProfile(o.memprofile, o.log)
	}

	spec := clusterSpec{nodes: o.nodes, inProcess: o.inProcess, brokerBin: o.brokerBin, pprof: o.brokerPprof, dir: o.dir, out: o.log}
	if o.addr == "" && !o.inProcess && o.brokerBin == "" {
		spec.brokerBin = filepath.Join(o.dir, "broker")
		fmt.Fprintf(o.log, "# building the broker: go build -o %s github.com/txmq/txmq/cmd/broker\n", spec.brokerBin)
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", spec.brokerBin, "github.com/txmq/txmq/cmd/broker").CombinedOutput(); err != nil {
			return fmt.Errorf("building the broker: %v\n%s", err, out)
		}
	}
	if err := describeMachine(o, stdout); err != nil {
		return err
	}
	if !o.tls && !o.auth {
		return runWorkloads(ctx, o, spec, stdout)
	}
	return compare(ctx, o, spec, stdout)
}

// compare runs the workloads without security and with what --tls and
// --auth turn on, --rounds times, interleaved.
func compare(ctx context.Context, o *options, off clusterSpec, stdout io.Writer) error {
	on := off
	var what []string
	if o.tls {
		var err error
		if on.tls, err = newBenchTLS(filepath.Join(o.dir, "tls")); err != nil {
			return err
		}
		what = append(what, "TLS (client certificates required, mutual TLS between the nodes)")
	}
	if o.auth {
		var err error
		if on.auth, err = newBenchAuth(o.dir); err != nil {
			return err
		}
		what = append(what, "auth and ACL (a bcrypt token per call, rules checked per request)")
	}
	// The headers go with the table; JSON results say tls and auth.
	headers := stdout
	if o.output == "json" {
		headers = o.log
	}
	for round := 1; round <= o.rounds; round++ {
		fmt.Fprintf(headers, "# round %d of %d: plaintext, no auth\n", round, o.rounds)
		if err := runWorkloads(ctx, o, off, stdout); err != nil {
			return err
		}
		fmt.Fprintf(headers, "# round %d of %d: %s\n", round, o.rounds, strings.Join(what, ", "))
		if err := runWorkloads(ctx, o, on, stdout); err != nil {
			return err
		}
	}
	return nil
}

// prepareDir makes the data directory (a temporary one without --dir,
// removed by cleanup unless --keep).
func prepareDir(o *options) (cleanup func(), err error) {
	cleanup = func() {}
	if o.dir != "" {
		return cleanup, os.MkdirAll(o.dir, 0o700)
	}
	dir, err := os.MkdirTemp("", "txmq-bench-")
	if err != nil {
		return nil, err
	}
	o.dir = dir
	if !o.keep {
		cleanup = func() { os.RemoveAll(dir) }
	}
	return cleanup, nil
}

// describeMachine measures the data directory's fsync, a write's log
// appends on three nodes and a round trip between two processes, and
// prints them with the cores and the load average, as the first result.
func describeMachine(o *options, stdout io.Writer) error {
	fs, err := measureFsync(o.dir, 200)
	if err != nil {
		return err
	}
	inOrder, atOnce, err := measureQuorumAppends(o.dir, quorumRounds)
	if err != nil {
		return err
	}
	rt, rtIdle, err := measureRoundTrip(1000)
	if err != nil {
		return err
	}
	machine := &result{Workload: "machine", Cluster: runtime.GOOS + "/" + runtime.GOARCH}
	machine.extra("cores", "runtime.NumCPU", float64(runtime.NumCPU()))
	machine.extra("fsync_p50_us", "write+fsync of a 4 KiB page in the data directory, p50 (µs)", us(fs.P50))
	machine.extra("fsync_p99_us", "same, p99 (µs)", us(fs.P99))
	machine.extra("fsync_max_us", "same, max (µs)", us(fs.Max))
	machine.extra("quorum_append_p50_us", "a write's log appends on three logs in the data directory, the leader's then the followers' (hashicorp/raft's order), until the first follower's, p50 (µs)", us(inOrder.P50))
	machine.extra("quorum_append_p99_us", "same, p99 (µs)", us(inOrder.P99))
	machine.extra("quorum_append_max_us", "same, max (µs)", us(inOrder.Max))
	machine.extra("quorum_append_at_once_p50_us", "the same appends all at once (a leader that appends while it replicates), p50 (µs)", us(atOnce.P50))
	machine.extra("quorum_append_at_once_p99_us", "same, p99 (µs)", us(atOnce.P99))
	machine.extra("round_trip_p50_us", "a 64-byte round trip over loopback TCP between two processes, p50 (µs)", us(rt.P50))
	machine.extra("round_trip_p99_us", "same, p99 (µs)", us(rt.P99))
	machine.extra("round_trip_idle_p50_us", "the same round trip after a 200 µs pause, p50 (µs)", us(rtIdle.P50))
	machine.extra("round_trip_idle_p99_us", "same, p99 (µs)", us(rtIdle.P99))
	load, loadOK := loadAvg()
	if loadOK {
		machine.extra("loadavg_1m", "the machine's 1-minute load average at the start", load)
	}
	if o.output == "json" {
		return writeJSON(stdout, machine)
	}
	fmt.Fprintf(stdout, "machine: %d cores, %s, load average %.2f; data in %s: write+fsync of a 4 KiB page p50 %.3f ms, p99 %.3f ms, max %.3f ms (200 fsyncs); a round trip between two processes over loopback p50 %.3f ms, p99 %.3f ms back to back, p50 %.3f ms, p99 %.3f ms after a 200 µs pause (1,000 each)\n",
		runtime.NumCPU(), machine.Cluster, load, o.dir, us(fs.P50)/1e3, us(fs.P99)/1e3, us(fs.Max)/1e3, us(rt.P50)/1e3, us(rt.P99)/1e3, us(rtIdle.P50)/1e3, us(rtIdle.P99)/1e3)
	fmt.Fprintf(stdout, "a write's log appends on three logs on this disk, the leader's then the followers' until the first is done (hashicorp/raft's order): p50 %.3f ms, p99 %.3f ms, max %.3f ms; all three at once: p50 %.3f ms, p99 %.3f ms (%d rounds each, alternated)\n",
		us(inOrder.P50)/1e3, us(inOrder.P99)/1e3, us(inOrder.Max)/1e3, us(atOnce.P50)/1e3, us(atOnce.P99)/1e3, quorumRounds)
	return nil
}

// runWorkloads runs each of --workloads on a fresh cluster (tx, tx-oneway
// and send once per --producers) and prints each result as it comes.
func runWorkloads(ctx context.Context, o *options, spec clusterSpec, stdout io.Writer) error {
	stamp := time.Now().Format("150405")
	emit := func(r *result, err error) error {
		if err != nil {
			return err
		}
		if o.output == "json" {
			return writeJSON(stdout, r)
		}
		writeTable(stdout, r)
		return nil
	}
	for n, w := range o.workloads {
		runID := fmt.Sprintf("%s-%s-%d", w, stamp, n+1)
		topic := "bench-" + runID
		fmt.Fprintf(o.log, "# running %s\n", w)
		switch w {
		case "tx", "tx-oneway", "send":
			for _, p := range o.producers {
				r, err := runOn(ctx, o, spec, func(e *env) (*result, error) {
					return closedLoop(ctx, e, w, p, topic+"-"+strconv.Itoa(p), txmq.StartEarliest)
				}, fmt.Sprint(runID, "-", p))
				if err := emit(r, err); err != nil {
					return err
				}
			}
		case "e2e":
			if err := emit(runOn(ctx, o, spec, func(e *env) (*result, error) { return e2e(ctx, e, topic) }, runID)); err != nil {
				return err
			}
		case "checkback":
			if err := emit(runOn(ctx, o, spec, func(e *env) (*result, error) { return checkbackRun(ctx, e, topic) }, runID)); err != nil {
				return err
			}
		case "backlog":
			if err := emit(backlog(ctx, o, spec, slices.Max(o.producers), runID)); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// runOn starts a fresh cluster (unless --addr), runs fn on it, and stops it.
func runOn(ctx context.Context, o *options, spec clusterSpec, fn func(*env) (*result, error), runID string) (*result, error) {
	var c cluster = remote(strings.Split(o.addr, ","))
	var ready time.Duration
	if o.addr == "" {
		var err error
		if c, ready, err = startCluster(ctx, spec); err != nil {
			return nil, err
		}
	}
	e := &env{o: o, c: c, m: newMeter(c, o.breakdown), runID: runID, tls: spec.tls.clientTLS(), token: spec.auth.clientToken()}
	r, err := fn(e)
	if err == nil {
		if err = c.ended(); err != nil {
			err = fmt.Errorf("during the run: %w", err)
		}
	}
	if r != nil && spec.tls != nil {
		r.extra("tls", "1: TLS on the API with client certificates and mutual TLS between the nodes", 1)
	}
	if r != nil && spec.auth != nil {
		r.extra("auth", "1: an auth file on every broker, a token on every call, rules checked per request", 1)
	}
	if r != nil {
		if load, ok := loadAvg(); ok {
			r.extra("loadavg_1m", "the machine's 1-minute load average at the end of the run", load)
		}
		if ready > 0 {
			r.extra("ready_s", "seconds from starting the brokers until a first write succeeded", ready.Seconds())
		}
		r.usage = e.m.result()
		r.Cluster, r.Nodes = c.what(), len(c.addrs())
		if o.breakdown && err == nil {
			r.stages, err = e.m.stages(o.inProcess)
		}
	}
	if cerr := c.close(); cerr != nil {
		fmt.Fprintf(o.log, "# stopping the cluster: %v\n", cerr)
	}
	return r, err
}

// loadAvg is the 1-minute load average: other work on the machine shows
// in every figure, so the output says how much there was.
func loadAvg() (float64, bool) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(f[0], 64)
	return v, err == nil
}

func writeHeapProfile(path string, log io.Writer) {
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintf(log, "txmq-bench: --memprofile: %v\n", err)
		return
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		fmt.Fprintf(log, "txmq-bench: --memprofile: %v\n", err)
	}
}
