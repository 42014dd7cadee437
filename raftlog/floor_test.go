package raftlog

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The Raft floor: hashicorp/raft alone, configured as txmq configures it
// (raftConfig, newTransport, the wal), three voters on loopback TCP, a state
// machine that does nothing, and writers calling raft.Apply inside the
// leader's process, with no client, gRPC, batcher or store. What it reaches
// on a machine is the most a txmq write can reach there: docs/benchmarks.md
// sets txmq's figures beside it.
//
//	go test -run '^$' -bench RaftFloor -benchtime 1x ./raftlog
//
// processes=3 runs each voter in its own process (this test binary,
// started again), as txmq-bench and make bench-peers run the brokers;
// processes=1 runs the three in this one. TXMQ_RAFT_FLOOR_DURATION sets the
// measured time of each run (default 10s).

const floorEntry = 300 // bytes per entry: a 256-byte body and its command

// floorResult is what one measured run of the writers gives.
type floorResult struct {
	Writes  int     `json:"writes"`
	Seconds float64 `json:"seconds"`
	P50     float64 `json:"p50_ms"`
	P99     float64 `json:"p99_ms"`
	Err     string  `json:"error,omitempty"`
}

func BenchmarkRaftFloor(b *testing.B) {
	d := 10 * time.Second
	if s := os.Getenv("TXMQ_RAFT_FLOOR_DURATION"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			b.Fatalf("TXMQ_RAFT_FLOOR_DURATION: %v", err)
		}
	}
	for _, procs := range []int{3, 1} {
		for _, writers := range []int{1, 16} {
			b.Run(fmt.Sprintf("processes=%d/writers=%d", procs, writers), func(b *testing.B) {
				var r floorResult
				if procs == 1 {
					r = floorInProcess(b, writers, d)
				} else {
					r = floorProcesses(b, writers, d)
				}
				if r.Err != "" {
					b.Fatal(r.Err)
				}
				b.ReportMetric(0, "ns/op")
				b.ReportMetric(float64(r.Writes)/r.Seconds, "writes/s")
				b.ReportMetric(r.P50, "p50-ms")
				b.ReportMetric(r.P99, "p99-ms")
			})
		}
	}
}

// floorVoter is one voter of the floor's cluster.
type floorVoter struct {
	raft  *raft.Raft
	trans *raft.NetworkTransport
	logs  logBackend
}

// startFloorVoter starts voter id on ln with its log in dir, and bootstraps
// it with servers (every voter is bootstrapped with the same set).
func startFloorVoter(id, dir string, ln net.Listener, servers []raft.Server) (*floorVoter, error) {
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := Config{NodeID: id, Dir: dir, Listener: ln, Logger: logger}.Defaults()
	layer, err := streamLayer(cfg, logger)
	if err != nil {
		return nil, err
	}
	v := &floorVoter{trans: newTransport(layer, newHCLogger(logger))}
	if v.logs, err = openLogBackend(cfg, logger); err != nil {
		v.trans.Close()
		return nil, err
	}
	v.raft, err = raft.NewRaft(raftConfig(cfg, newHCLogger(logger)), nopFSM{}, v.logs, v.logs, raft.NewInmemSnapshotStore(), v.trans)
	if err == nil {
		err = v.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
	}
	if err != nil {
		v.close()
		return nil, err
	}
	return v, nil
}

func (v *floorVoter) close() {
	if v.raft != nil {
		v.raft.Shutdown().Error()
	}
	v.trans.Close()
	v.logs.Close()
}

// floorServers is the voter set at addrs: n1, n2 and n3.
func floorServers(addrs []string) []raft.Server {
	var servers []raft.Server
	for i, a := range addrs {
		servers = append(servers, raft.Server{ID: raft.ServerID(fmt.Sprintf("n%d", i+1)), Address: raft.ServerAddress(a), Suffrage: raft.Voter})
	}
	return servers
}

func floorInProcess(b *testing.B, writers int, d time.Duration) floorResult {
	var lns []net.Listener
	var addrs []string
	for range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	servers := floorServers(addrs)
	var voters []*floorVoter
	for i, ln := range lns {
		v, err := startFloorVoter(string(servers[i].ID), b.TempDir(), ln, servers)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(v.close)
		voters = append(voters, v)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, v := range voters {
			if v.raft.State() == raft.Leader {
				return floorWrite(v.raft, writers, d)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return floorResult{Err: "no leader within 10s"}
}

// floorWrite runs writers closed loops of raft.Apply on r for a warm-up
// second, then for d, and measures the second part.
func floorWrite(r *raft.Raft, writers int, d time.Duration) floorResult {
	const warmup = time.Second
	cmd := make([]byte, floorEntry)
	start := time.Now()
	from, to := start.Add(warmup), start.Add(warmup+d)
	lat := make([][]time.Duration, writers)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t := time.Now()
				if !t.Before(to) {
					return
				}
				if err := r.Apply(cmd, 10*time.Second).Error(); err != nil {
					errs <- err
					return
				}
				if t.After(from) {
					lat[w] = append(lat[w], time.Since(t))
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return floorResult{Err: err.Error()}
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return floorResult{Err: "no write finished in the measured time"}
	}
	slices.Sort(all)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return floorResult{Writes: len(all), Seconds: d.Seconds(), P50: ms(all[len(all)/2]), P99: ms(all[len(all)*99/100])}
}

// floorProcesses starts the voters as three processes of this test binary
// (TestRaftFloorVoter) and has the leader's run the writers.
//
// The protocol on each child's stdin and stdout, one line each: the child
// says "addr A" once it listens; it is told "peers A1 A2 A3" and starts
// its voter; it is told "run W D" and answers "result {json}" when it is
// the leader (after W writers ran for D) or "follower" when it is not.
func floorProcesses(b *testing.B, writers int, d time.Duration) floorResult {
	type child struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Scanner
	}
	var children []*child
	var addrs []string
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRaftFloorVoter$", "-test.count=1")
		cmd.Env = append(os.Environ(), fmt.Sprintf("TXMQ_RAFT_FLOOR_VOTER=n%d,%s", i+1, b.TempDir()))
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
		b.Cleanup(func() {
			// Closing stdin ends the voter; one that does not end soon
			// is killed.
			c.in.Close()
			done := make(chan struct{})
			go func() { c.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				c.cmd.Process.Kill()
				<-done
			}
		})
		children = append(children, c)
		addr, ok := strings.CutPrefix(floorLine(b, c.out), "addr ")
		if !ok {
			b.Fatalf("voter n%d did not say its address", i+1)
		}
		addrs = append(addrs, addr)
	}
	for _, c := range children {
		fmt.Fprintf(c.in, "peers %s\n", strings.Join(addrs, " "))
	}
	results := make(chan string, len(children))
	for _, c := range children {
		fmt.Fprintf(c.in, "run %d %s\n", writers, d)
		go func() { results <- floorLine(b, c.out) }()
	}
	r := floorResult{Err: "no voter was the leader"}
	for range children {
		line := <-results
		if js, ok := strings.CutPrefix(line, "result "); ok {
			r = floorResult{}
			if err := json.Unmarshal([]byte(js), &r); err != nil {
				r.Err = fmt.Sprintf("the leader's result %q: %v", js, err)
			}
		} else if line != "follower" {
			r.Err = fmt.Sprintf("a voter answered %q", line)
		}
	}
	return r
}

// floorLine reads one line of a child's output; "" when it ended.
func floorLine(b *testing.B, s *bufio.Scanner) string {
	if !s.Scan() {
		b.Errorf("a voter process ended: %v", s.Err())
		return ""
	}
	return s.Text()
}

// TestRaftFloorVoter is one voter process of BenchmarkRaftFloor; it does
// nothing unless that benchmark started it.
func TestRaftFloorVoter(t *testing.T) {
	spec := os.Getenv("TXMQ_RAFT_FLOOR_VOTER")
	if spec == "" {
		t.Skip("a voter process of BenchmarkRaftFloor, started by it")
	}
	id, dir, _ := strings.Cut(spec, ",")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("addr %s\n", ln.Addr())
	in := bufio.NewScanner(os.Stdin)
	var v *floorVoter
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 4 && f[0] == "peers":
			if v, err = startFloorVoter(id, dir, ln, floorServers(f[1:])); err != nil {
				t.Fatal(err)
			}
		case len(f) == 3 && f[0] == "run" && v != nil:
			writers, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatal(err)
			}
			d, err := time.ParseDuration(f[2])
			if err != nil {
				t.Fatal(err)
			}
			fmt.Println(floorRun(v.raft, writers, d))
		default:
			t.Fatalf("voter %s: unexpected %q", id, in.Text())
		}
	}
	// The benchmark closed stdin: it is done with this voter. Exit without
	// the leak check, which a voter's Raft goroutines would fail.
	if v != nil {
		v.close()
	}
	os.Exit(0)
}

// floorRun is a voter's answer to "run": the writers' result when it is
// (or, within 10 s, becomes) the leader, "follower" once another voter is.
func floorRun(r *raft.Raft, writers int, d time.Duration) string {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if r.State() == raft.Leader {
			js, _ := json.Marshal(floorWrite(r, writers, d))
			return "result " + string(js)
		}
		if _, id := r.LeaderWithID(); id != "" {
			return "follower"
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "follower"
}

// nopFSM applies nothing: the floor measures the log, not the store.
type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnap{}, nil }
func (nopFSM) Restore(r io.ReadCloser) error       { return r.Close() }

type nopSnap struct{}

func (nopSnap) Persist(s raft.SnapshotSink) error { return s.Close() }
func (nopSnap) Release()                          {}
