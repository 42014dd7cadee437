package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/internal/procs"
	"github.com/txmq/txmq/raftlog"
)

// cluster is the brokers a workload runs against.
type cluster interface {
	// addrs are the gRPC addresses of every node.
	addrs() []string
	// usage is the CPU time the brokers used so far and their peak RSS;
	// ok is false when they cannot be measured (--addr).
	usage() (cpu time.Duration, peakRSS uint64, ok bool)
	// heapInUse is the largest Go heap in use of any broker right now.
	heapInUse() (uint64, bool)
	// metricsAddrs are where the nodes serve /metrics, in node order (n1,
	// n2, ...); nil when unknown (--addr).
	metricsAddrs() []string
	// what names the cluster for the output.
	what() string
	// ended names the brokers that stopped by themselves (figures taken
	// then would be a smaller cluster's); nil while all run, or when it
	// cannot tell.
	ended() error
	close() error
}

// clusterSpec says how to start a cluster.
type clusterSpec struct {
	nodes     int
	inProcess bool
	brokerBin string     // the broker binary, for processes
	pprof     bool       // brokers serve pprof on a free loopback port
	dir       string     // parent of the nodes' data directories
	seed      string     // an fsm.db copied into every node's data directory first
	tls       *benchTLS  // --tls: certificates; nil for plaintext
	auth      *benchAuth // --auth: the auth file and tokens; nil for none
	out       io.Writer
}

func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// node is one member's addresses and data directory. In the bench's
// process its listeners are bound before the brokers start and handed to
// them, so that no port is chosen twice; broker processes get addresses
// (loopback.StableAddr).
type node struct {
	id, dir, grpc, raft, metrics, pprof string
	grpcL, raftL, metricsL              net.Listener
}

// listen binds n's three ports on 127.0.0.1 for a broker in this process.
func (n *node) listen() error {
	for _, l := range []struct {
		ln   *net.Listener
		addr *string
	}{{&n.grpcL, &n.grpc}, {&n.raftL, &n.raft}, {&n.metricsL, &n.metrics}} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		*l.ln, *l.addr = ln, ln.Addr().String()
	}
	return nil
}

// closeListeners closes the listeners of nodes that no broker took over.
func closeListeners(nodes []node) {
	for _, n := range nodes {
		for _, l := range []net.Listener{n.grpcL, n.raftL, n.metricsL} {
			if l != nil {
				l.Close()
			}
		}
	}
}

func planNodes(spec clusterSpec) ([]node, []raftlog.Peer, error) {
	var nodes []node
	var peers []raftlog.Peer
	for i := 1; i <= spec.nodes; i++ {
		n, err := planNode(spec, fmt.Sprint("n", i))
		if err != nil {
			closeListeners(nodes)
			return nil, nil, err
		}
		nodes = append(nodes, n)
		peers = append(peers, raftlog.Peer{ID: n.id, RaftAddr: n.raft})
	}
	return nodes, peers, nil
}

// planNode makes node id's data directory (seeded when spec says so) and
// its addresses, bound when it runs in this process.
func planNode(spec clusterSpec, id string) (n node, err error) {
	n.id = id
	defer func() {
		if err != nil {
			closeListeners([]node{n})
		}
	}()
	if n.dir, err = os.MkdirTemp(spec.dir, n.id+"-"); err != nil {
		return n, err
	}
	if spec.inProcess {
		if err := n.listen(); err != nil {
			return n, err
		}
	} else {
		for _, a := range []*string{&n.grpc, &n.raft, &n.metrics} {
			if *a, err = loopback.StableAddr(); err != nil {
				return n, err
			}
		}
	}
	if spec.pprof {
		if n.pprof, err = loopback.StableAddr(); err != nil {
			return n, err
		}
	}
	if spec.seed != "" {
		if err := copyFile(filepath.Join(n.dir, "fsm.db"), spec.seed); err != nil {
			return n, fmt.Errorf("seed %s: %w", n.id, err)
		}
	}
	return n, nil
}

// startCluster starts spec's brokers and returns once a write succeeds,
// with the time that took from starting them (their data directories,
// seeded ones included, already in place).
func startCluster(ctx context.Context, spec clusterSpec) (cluster, time.Duration, error) {
	nodes, peers, err := planNodes(spec)
	if err != nil {
		return nil, 0, err
	}
	start := time.Now()
	var c cluster
	if spec.inProcess {
		c, err = startInProcess(nodes, peers, spec)
	} else {
		c, err = startProcesses(spec, nodes, peers)
	}
	if err != nil {
		return nil, 0, err
	}
	for _, n := range nodes {
		if n.pprof != "" {
			fmt.Fprintf(spec.out, "# broker %s: pprof on http://%s/debug/pprof/\n", n.id, n.pprof)
		}
	}
	if err := waitWritable(ctx, c.addrs(), spec.tls.clientTLS(), spec.auth.clientToken()); err != nil {
		c.close()
		return nil, 0, err
	}
	// A majority is writable without the others: every node must be up.
	if err := c.ended(); err != nil {
		c.close()
		return nil, 0, err
	}
	return c, time.Since(start), nil
}

// waitWritable returns once a write through the client succeeds: a leader
// is elected and knows every member's address.
func waitWritable(ctx context.Context, addrs []string, conf *tls.Config, token string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: addrs, TLS: conf, Token: token, Logger: quiet, RetryTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer p.Close()
	for {
		_, err := p.Send(ctx, txmq.Message{Topic: "bench-ready", Key: "ready", Body: []byte("ready")})
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not writable within 60s: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// quiet drops the in-process brokers' logs; at Warn, so that the Info line
// per message state change is not even formatted.
var quiet = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelWarn}))

// ---- brokers in this process ----

type inProcess struct {
	brokers []*broker.Broker
}

// startInProcess opens nodes' brokers on the listeners planNodes bound,
// which they take over; should one fail, the brokers opened are closed and
// the listeners not taken over too.
func startInProcess(nodes []node, peers []raftlog.Peer, spec clusterSpec) (*inProcess, error) {
	c := &inProcess{}
	for i, n := range nodes {
		cfg := broker.Config{
			Raft:            raftlog.Config{NodeID: n.id, Dir: n.dir, Listener: n.raftL, Bootstrap: true, Peers: peers},
			GRPCListener:    n.grpcL,
			MetricsListener: n.metricsL,
			Logger:          quiet,
		}
		if spec.auth != nil {
			spec.auth.configure(&cfg)
		}
		var err error
		if spec.tls != nil {
			err = spec.tls.configure(n.id, &cfg)
		}
		var b *broker.Broker
		if err == nil {
			b, err = broker.Open(cfg)
		}
		if err != nil {
			c.close()
			closeListeners(nodes[i:])
			return nil, err
		}
		c.brokers = append(c.brokers, b)
	}
	return c, nil
}

func (c *inProcess) addrs() []string {
	var out []string
	for _, b := range c.brokers {
		out = append(out, b.Addr())
	}
	return out
}

// usage is this whole process's: the brokers and the bench's clients.
func (c *inProcess) usage() (time.Duration, uint64, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0, false
	}
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return cpu, uint64(ru.Maxrss) << 10, true
}

func (c *inProcess) metricsAddrs() []string {
	var out []string
	for _, b := range c.brokers {
		out = append(out, b.MetricsAddr())
	}
	return out
}

func (c *inProcess) heapInUse() (uint64, bool) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse, true
}

func (c *inProcess) what() string {
	return fmt.Sprintf("%d nodes in the bench's process (CPU and RSS include the bench's clients)", len(c.brokers))
}

// ended is nil: a broker in this process does not stop by itself.
func (c *inProcess) ended() error { return nil }

func (c *inProcess) close() error {
	var errs []error
	for _, b := range c.brokers {
		errs = append(errs, b.Close())
	}
	return errors.Join(errs...)
}

// ---- broker processes ----

type procCluster struct {
	nodes []node
	procs procs.Group
}

func startProcesses(spec clusterSpec, nodes []node, peers []raftlog.Peer) (*procCluster, error) {
	var pl []string
	for _, p := range peers {
		pl = append(pl, p.ID+"="+p.RaftAddr)
	}
	c := &procCluster{nodes: nodes}
	for _, n := range nodes {
		args := []string{"--data", n.dir, "--node-id", n.id, "--listen", n.grpc, "--raft-listen", n.raft,
			"--peers", strings.Join(pl, ","), "--metrics-listen", n.metrics, "--log-level", "warn"}
		if n.pprof != "" {
			args = append(args, "--pprof-listen", n.pprof)
		}
		if spec.tls != nil {
			args = append(args, spec.tls.args(n.id)...)
		}
		if spec.auth != nil {
			args = append(args, spec.auth.args()...)
		}
		cmd := exec.Command(spec.brokerBin, args...)
		if err := c.procs.Start("broker "+n.id, cmd, filepath.Join(n.dir, "broker.log")); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func (c *procCluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.grpc)
	}
	return out
}

func (c *procCluster) usage() (time.Duration, uint64, bool) { return c.procs.Usage() }

// heapInUse scrapes go_memstats_heap_inuse_bytes from every node's /metrics.
func (c *procCluster) heapInUse() (uint64, bool) {
	var peak uint64
	client := http.Client{Timeout: 5 * time.Second}
	for _, n := range c.nodes {
		resp, err := client.Get("http://" + n.metrics + "/metrics")
		if err != nil {
			return 0, false
		}
		v, ok := uint64(0), false
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if s, found := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); found {
				f, err := strconv.ParseFloat(s, 64)
				v, ok = uint64(f), err == nil
			}
		}
		resp.Body.Close()
		if !ok {
			return 0, false
		}
		peak = max(peak, v)
	}
	return peak, true
}

func (c *procCluster) metricsAddrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.metrics)
	}
	return out
}

func (c *procCluster) what() string {
	return fmt.Sprintf("%d broker processes (CPU and RSS are the brokers' only)", c.procs.Len())
}

func (c *procCluster) ended() error { return c.procs.Ended() }

// close stops every broker by its PID: SIGTERM, then SIGKILL after 15 s.
func (c *procCluster) close() error { return c.procs.Stop() }

// ---- a cluster started elsewhere ----

type remote []string

func (r remote) addrs() []string                      { return r }
func (r remote) usage() (time.Duration, uint64, bool) { return 0, 0, false }
func (r remote) heapInUse() (uint64, bool)            { return 0, false }
func (r remote) metricsAddrs() []string               { return nil }
func (r remote) what() string                         { return "the brokers at " + strings.Join(r, ",") }
func (r remote) ended() error                         { return nil }
func (r remote) close() error                         { return nil }
