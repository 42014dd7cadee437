// Command peers runs NATS JetStream (nats-server v2.15.2, three server
// processes on loopback, an R3 file stream) through the shapes txmq-bench
// measures, with NATS's default sync_interval and with
// sync_interval: always, and prints them beside txmq-bench's JSON results
// with the ratios against the targets of docs/benchmarks.md.
//
//	go run . --txmq txmq.json
//
// It is a module of its own so that txmq's go.mod does not carry NATS; it
// takes txmq's internal/pace and internal/procs through a replace of the
// root module.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/txmq/txmq/internal/pace"
	"github.com/txmq/txmq/internal/procs"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		os.Exit(serve(os.Args[2:], os.Stderr))
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type options struct {
	duration, warmup time.Duration
	rate             float64
	size             int
	txmq             string
	floor            string
	output           string
	configs          []string
	shapes           []string
	rounds           []string
}

func run(args []string, stdout, stderr io.Writer) int {
	o := &options{}
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured time of each run")
	fs.DurationVar(&o.warmup, "warmup", 2*time.Second, "time each run works before it measures")
	fs.Float64Var(&o.rate, "rate", 2000, "e2e: scheduled publishes per second")
	fs.IntVar(&o.size, "size", 256, "payload size in bytes (at least 8)")
	fs.StringVar(&o.txmq, "txmq", "", "txmq-bench -o json output to compare with")
	fs.StringVar(&o.floor, "floor", "", "output of raftlog's BenchmarkRaftFloor (go test -bench RaftFloor) to set txmq and NATS beside")
	fs.StringVar(&o.output, "o", "table", "output: table or json")
	configs := fs.String("configs", "default,always", "NATS fsync settings to run: default (sync_interval 2m), always (sync_interval: always)")
	shapes := fs.String("shapes", "sync-1,sync-16,async,e2e", "NATS runs on each cluster: sync-1, sync-16 (sync publishes by 1 or 16 goroutines, a connection each), sync-16-one-conn (16 goroutines on one connection), async, e2e")
	fs.Func("round", "a file of one alternated round (scripts/bench-rounds.sh): the JSON lines of txmq-bench and of peers -o json in the order they ran; repeat for each round", func(path string) error {
		o.rounds = append(o.rounds, path)
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	o.configs, o.shapes = strings.Split(*configs, ","), strings.Split(*shapes, ",")
	if o.size < 8 || (o.output != "table" && o.output != "json") {
		fmt.Fprintln(stderr, "peers: --size must be at least 8, -o table or json")
		return 2
	}
	for _, c := range o.configs {
		if c != "default" && c != "always" {
			fmt.Fprintf(stderr, "peers: --configs: unknown %q\n", c)
			return 2
		}
	}
	for _, s := range o.shapes {
		if !slices.ContainsFunc(natsShapes, func(n natsShape) bool { return n.name == s }) {
			fmt.Fprintf(stderr, "peers: --shapes: unknown %q\n", s)
			return 2
		}
	}
	var rounds []round
	for _, path := range o.rounds {
		r, err := readRound(path)
		if err != nil {
			fmt.Fprintf(stderr, "peers: --round: %v\n", err)
			return 2
		}
		rounds = append(rounds, r)
	}
	var txmqResults []map[string]any
	if o.txmq != "" {
		var err error
		if txmqResults, err = readJSONLines(o.txmq); err != nil {
			fmt.Fprintf(stderr, "peers: --txmq: %v\n", err)
			return 2
		}
	}
	var floor []floorRun
	if o.floor != "" {
		var err error
		if floor, err = readFloorFile(o.floor); err != nil {
			fmt.Fprintf(stderr, "peers: --floor: %v\n", err)
			return 2
		}
	}
	dir, err := os.MkdirTemp("", "txmq-peers-")
	if err != nil {
		fmt.Fprintf(stderr, "peers: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)

	var results []*result
	for _, cfg := range o.configs {
		rs, err := runConfig(o, dir, cfg, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "peers: %s: %v\n", cfg, err)
			return 1
		}
		results = append(results, rs...)
	}
	if o.output == "json" {
		enc := json.NewEncoder(stdout)
		for _, r := range results {
			if err := enc.Encode(r.object()); err != nil {
				return 1
			}
		}
		return 0
	}
	report(stdout, results, txmqResults)
	roundsTable(stdout, rounds)
	breakdownTable(stdout, txmqResults)
	floorTable(stdout, floor, results, txmqResults)
	return 0
}

func readJSONLines(path string) ([]map[string]any, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			return nil, fmt.Errorf("%q: %w", sc.Text(), err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// natsShape is one way of running NATS, on a stream of its own.
type natsShape struct {
	name string
	fn   func(context.Context, *options, string, string, *meter) (*result, error)
}

// natsShapes are the runs on each NATS cluster, in their order.
var natsShapes = []natsShape{
	{"sync-1", func(ctx context.Context, o *options, url, stream string, m *meter) (*result, error) {
		return syncPublish(ctx, o, url, stream, 1, false, m)
	}},
	{"sync-16", func(ctx context.Context, o *options, url, stream string, m *meter) (*result, error) {
		return syncPublish(ctx, o, url, stream, 16, false, m)
	}},
	{"sync-16-one-conn", func(ctx context.Context, o *options, url, stream string, m *meter) (*result, error) {
		return syncPublish(ctx, o, url, stream, 16, true, m)
	}},
	{"async", asyncPublish},
	{"e2e", e2e},
}

// runConfig starts a fresh three-server cluster with one fsync setting and
// runs the shapes of --shapes on it, each on a stream of its own.
func runConfig(o *options, dir, cfg string, log io.Writer) ([]*result, error) {
	cdir, err := os.MkdirTemp(dir, cfg+"-")
	if err != nil {
		return nil, err
	}
	c, err := startNATS(cdir, cfg == "always")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := c.close(); err != nil {
			fmt.Fprintf(log, "# stopping NATS: %v\n", err)
		}
	}()
	url := strings.Join(c.urls, ",")
	var out []*result
	for _, s := range natsShapes {
		if !slices.Contains(o.shapes, s.name) {
			continue
		}
		fmt.Fprintf(log, "# NATS %s: %s\n", cfg, s.name)
		ctx, cancel := context.WithTimeout(context.Background(), o.warmup+o.duration+2*time.Minute)
		stream := "BENCH_" + strings.ReplaceAll(strings.ToUpper(s.name), "-", "_")
		if err := createStream(ctx, url, stream); err != nil {
			cancel()
			return nil, err
		}
		m := &meter{c: c}
		r, err := s.fn(ctx, o, url, stream, m)
		cancel()
		if err == nil {
			err = c.ended()
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
		r.Config, r.Shape, r.Size = cfg, s.name, o.size
		r.cpu, r.wall, r.rss, r.usageOK = m.cpu, m.wall, m.rss, m.ok
		r.machine, r.machineOK = m.machine, m.machineOK
		r.load = loadAvg()
		out = append(out, r)
	}
	return out, nil
}

// createStream makes an R3 file stream, retrying while the cluster elects
// its JetStream leaders.
func createStream(ctx context.Context, url, name string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := js.CreateStream(cctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name)},
			Storage: jetstream.FileStorage, Replicas: 3})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("create stream %s: %w", name, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// meter takes the servers' CPU time over the measured window, and what
// the whole machine counted in it (txmq-bench's meter does the same).
type meter struct {
	c         *natsCluster
	cpu0      time.Duration
	machine0  procs.Machine
	t0        time.Time
	cpu       time.Duration
	wall      time.Duration
	rss       uint64
	ok        bool
	machine   procs.Machine
	machineOK bool
	startMu   sync.Once
	stopMu    sync.Once
}

func (m *meter) start() {
	m.startMu.Do(func() {
		m.t0 = time.Now()
		m.cpu0, _, m.ok = m.c.usage()
		m.machine0, m.machineOK = procs.ReadMachine()
	})
}

func (m *meter) stop() {
	m.stopMu.Do(func() {
		m.wall = time.Since(m.t0)
		cpu, rss, ok := m.c.usage()
		m.cpu, m.rss, m.ok = cpu-m.cpu0, rss, m.ok && ok
		machine, ok := procs.ReadMachine()
		m.machine, m.machineOK = machine.Sub(m.machine0), m.machineOK && ok
	})
}

type window struct{ from, to time.Time }

func (w window) in(t time.Time) bool { return !t.Before(w.from) && t.Before(w.to) }

func newWindow(o *options, start time.Time) window {
	from := start.Add(o.warmup)
	return window{from: from, to: from.Add(o.duration)}
}

// meterWindow runs the meter over the window, and returns when it closed.
func meterWindow(w window, m *meter) func() {
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(time.Until(w.from))
		m.start()
		time.Sleep(time.Until(w.to))
		m.stop()
	}()
	return func() { <-done }
}

// syncPublish: n goroutines publishing and waiting for the stream's ack
// (stored on a quorum) before the next, each on a connection of its own,
// or with oneConn all on one, as a service's handlers share theirs.
func syncPublish(ctx context.Context, o *options, url, stream string, n int, oneConn bool, m *meter) (*result, error) {
	subject := strings.ToLower(stream)
	w := newWindow(o, time.Now())
	wait := meterWindow(w, m)
	defer wait()
	var lat hist
	var ops, errs atomic.Int64
	var wg sync.WaitGroup
	var connErr error
	var once sync.Once
	var shared *nats.Conn
	if oneConn {
		nc, err := nats.Connect(url)
		if err != nil {
			return nil, err
		}
		defer nc.Close()
		shared = nc
	}
	for range n {
		wg.Go(func() {
			nc := shared
			if nc == nil {
				c, err := nats.Connect(url)
				if err != nil {
					once.Do(func() { connErr = err })
					return
				}
				defer c.Close()
				nc = c
			}
			js, err := jetstream.New(nc)
			if err != nil {
				once.Do(func() { connErr = err })
				return
			}
			body := make([]byte, o.size)
			for ctx.Err() == nil {
				t0 := time.Now()
				if !t0.Before(w.to) {
					return
				}
				if _, err := js.Publish(ctx, subject, body); err != nil {
					errs.Add(1)
					continue
				}
				if w.in(t0) {
					lat.add(time.Since(t0))
					ops.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if connErr != nil {
		return nil, connErr
	}
	r := &result{Publishers: n, Ops: ops.Load(), Errors: errs.Load(), Measured: o.duration}
	r.Throughput = float64(r.Ops) / o.duration.Seconds()
	r.lat("publish", &lat)
	return r, nil
}

// asyncJetStream connects to url for asynchronous publishing, up to 4,096
// acks outstanding.
func asyncJetStream(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// asyncPublish: one goroutine publishing without waiting, up to 4,096
// acks outstanding; throughput counts acked messages.
func asyncPublish(ctx context.Context, o *options, url, stream string, m *meter) (*result, error) {
	subject := strings.ToLower(stream)
	nc, js, err := asyncJetStream(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	w := newWindow(o, time.Now())
	wait := meterWindow(w, m)
	defer wait()
	var acked, errs atomic.Int64
	var lat hist
	var pending sync.WaitGroup
	body := make([]byte, o.size)
	for ctx.Err() == nil {
		t0 := time.Now()
		if !t0.Before(w.to) {
			break
		}
		f, err := js.PublishAsync(subject, body)
		if err != nil {
			errs.Add(1)
			continue
		}
		if !w.in(t0) {
			continue
		}
		pending.Go(func() {
			select {
			case <-f.Ok():
				lat.add(time.Since(t0))
				acked.Add(1)
			case <-f.Err():
				errs.Add(1)
			}
		})
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	pending.Wait()
	r := &result{Publishers: 1, Ops: acked.Load(), Errors: errs.Load(), Measured: o.duration}
	r.Throughput = float64(r.Ops) / o.duration.Seconds()
	r.lat("publish", &lat)
	return r, nil
}

// e2e: publishes scheduled at --rate (each sent asynchronously at its
// slot's time, woken by a pace.Timer as txmq-bench's e2e workers are), a
// durable pull consumer acking each message explicitly; latency from the
// slot's time to the consumer (no coordinated omission).
func e2e(ctx context.Context, o *options, url, stream string, m *meter) (*result, error) {
	subject := strings.ToLower(stream)
	nc, js, err := asyncJetStream(url)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if _, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "bench", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		return nil, err
	}
	cnc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	defer cnc.Close()
	cjs, err := jetstream.New(cnc)
	if err != nil {
		return nil, err
	}
	ccons, err := cjs.Consumer(ctx, stream, "bench")
	if err != nil {
		return nil, err
	}
	interval := time.Duration(float64(time.Second) / o.rate)
	first := time.Now().Add(500 * time.Millisecond)
	slot := func(i int64) time.Time { return first.Add(time.Duration(i) * interval) }
	w := newWindow(o, first)
	var lat hist
	var published, received, errs, late atomic.Int64
	cc, err := ccons.Consume(func(msg jetstream.Msg) {
		at := time.Now()
		ts := slot(int64(binary.BigEndian.Uint64(msg.Data())))
		if w.in(ts) {
			lat.add(at.Sub(ts))
			received.Add(1)
		}
		_ = msg.Ack()
	})
	if err != nil {
		return nil, err
	}
	defer cc.Stop()
	tm, err := pace.New()
	if err != nil {
		return nil, err
	}
	defer tm.Close()
	wait := meterWindow(w, m)
	defer wait()
	for i := int64(0); ctx.Err() == nil; i++ {
		ts := slot(i)
		if !ts.Before(w.to) {
			break
		}
		if err := tm.Until(ts); err != nil {
			return nil, err
		}
		if w.in(ts) && time.Since(ts) > time.Millisecond {
			late.Add(1)
		}
		body := make([]byte, o.size)
		binary.BigEndian.PutUint64(body, uint64(i))
		if _, err := js.PublishAsync(subject, body); err != nil {
			errs.Add(1)
			continue
		}
		if w.in(ts) {
			published.Add(1)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	deadline := time.Now().Add(10 * time.Second)
	for received.Load() < published.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	r := &result{Publishers: 1, Ops: received.Load(), Errors: errs.Load(), Measured: o.duration, Rate: o.rate, Late: late.Load()}
	r.Throughput = float64(r.Ops) / o.duration.Seconds()
	if missing := published.Load() - received.Load(); missing > 0 {
		r.Missing = missing
	}
	r.lat("e2e", &lat)
	return r, nil
}

// loadAvg is the machine's 1-minute load average, -1 if unknown: other
// work on the machine shows in every figure.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	var v float64
	if _, err := fmt.Sscan(string(b), &v); err != nil {
		return -1
	}
	return v
}

var errNoResult = errors.New("no such result")

// find returns the first txmq result matching workload and producers (0:
// any).
func find(rs []map[string]any, workload string, producers int) (map[string]any, error) {
	i := slices.IndexFunc(rs, func(r map[string]any) bool {
		return r["workload"] == workload && (producers == 0 || r["producers"] == float64(producers)) && !onOneProducer(r)
	})
	if i < 0 {
		return nil, fmt.Errorf("%w: txmq %s with %d producers", errNoResult, workload, producers)
	}
	return rs[i], nil
}
