package raftlog

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/txmq/txmq/internal/window"
)

// The Raft floor: hashicorp/raft alone, configured as txmq configures it
// (raftConfig, newTransport, the wal), three voters on loopback TCP and a
// state machine that does nothing: no batcher, no store, no sessions, no
// consumers. What it reaches on a machine is the most a txmq write can
// reach there; make bench-peers sets txmq's figures and NATS's beside it.
//
//	go test -run '^$' -bench RaftFloor -benchtime 1x ./raftlog
//
// Three shapes, each with 1 and 16 writers in closed loops:
//   - in-leader/processes=3: each voter in its own process (this test
//     binary, started again), as txmq-bench runs the brokers; the writers
//     call raft.Apply inside the leader's process;
//   - grpc-client/processes=3: the same voters, and the writers in this
//     process, each on its own gRPC connection with one bidirectional
//     stream, as a txmq producer writes on its session: one 300-byte
//     message in, raft.Apply, one empty message out;
//   - in-leader/processes=1: the three voters and the writers in this one
//     process.
//
// TXMQ_RAFT_FLOOR_DURATION sets the measured time of each run (default
// 10s), after one second of warm-up.

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
	for _, shape := range []string{"in-leader/processes=3", "grpc-client/processes=3", "in-leader/processes=1"} {
		for _, writers := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/writers=%d", shape, writers), func(b *testing.B) {
				var r floorResult
				switch shape {
				case "in-leader/processes=1":
					r = floorInProcess(b, writers, d)
				case "in-leader/processes=3":
					r = floorProcesses(b, writers, d, false)
				default:
					r = floorProcesses(b, writers, d, true)
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

func (v *floorVoter) write() error {
	return v.raft.Apply(make([]byte, floorEntry), 10*time.Second).Error()
}

// waitRole waits up to 10 s for a leader: true when it is this voter.
func (v *floorVoter) waitRole() (leader bool, err error) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if v.raft.State() == raft.Leader {
			return true, nil
		}
		if _, id := v.raft.LeaderWithID(); id != "" {
			return false, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false, errors.New("no leader within 10s")
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
	for _, v := range voters {
		leader, err := v.waitRole()
		if err != nil {
			return floorResult{Err: err.Error()}
		}
		if leader {
			return floorLoop(writers, d, func() (func() error, error) { return v.write, nil })
		}
	}
	return floorResult{Err: "the leader changed before the run"}
}

// floorLoop runs writers closed loops, each of the write that newWriter
// gives it, for a warm-up second, then for d, and measures the second part.
func floorLoop(writers int, d time.Duration, newWriter func() (func() error, error)) floorResult {
	const warmup = time.Second
	var writes []func() error
	for range writers {
		w, err := newWriter()
		if err != nil {
			return floorResult{Err: err.Error()}
		}
		writes = append(writes, w)
	}
	start := time.Now()
	from, to := start.Add(warmup), start.Add(warmup+d)
	lat := make([][]time.Duration, writers)
	errs := make(chan error, writers)
	var wg sync.WaitGroup
	for w, write := range writes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				t := time.Now()
				if !t.Before(to) {
					return
				}
				if err := write(); err != nil {
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

// floorService is the gRPC stream a voter serves to grpc-client writers:
// each message in is one raft.Apply, answered with an empty message.
var floorService = grpc.ServiceDesc{
	ServiceName: "txmq.floor.Floor",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName: "Write", ServerStreams: true, ClientStreams: true,
		Handler: func(srv any, s grpc.ServerStream) error {
			v := srv.(*floorVoter)
			for {
				in := new(wrapperspb.BytesValue)
				if err := s.RecvMsg(in); err != nil {
					return nil
				}
				if err := v.raft.Apply(in.Value, 10*time.Second).Error(); err != nil {
					return err
				}
				if err := s.SendMsg(&wrapperspb.BytesValue{}); err != nil {
					return err
				}
			}
		},
	}},
}

// grpcWriter opens a connection to addr with one floorService stream on
// it, with the API's flow-control windows; the write sends one entry on it
// and waits for the answer.
func grpcWriter(b *testing.B, addr string) (func() error, error) {
	conn, err := grpc.NewClient(addr, append(window.DialOptions(), grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		return nil, err
	}
	b.Cleanup(func() { conn.Close() })
	s, err := conn.NewStream(context.Background(), &floorService.Streams[0], "/txmq.floor.Floor/Write")
	if err != nil {
		return nil, err
	}
	body := &wrapperspb.BytesValue{Value: make([]byte, floorEntry)}
	return func() error {
		if err := s.SendMsg(body); err != nil {
			return err
		}
		return s.RecvMsg(new(wrapperspb.BytesValue))
	}, nil
}

// floorProcesses starts the voters as three processes of this test binary
// (TestRaftFloorVoter); the writers run in the leader's process, or in
// this one over gRPC (grpc).
//
// The protocol on each child's stdin and stdout, one line each: the child
// says "addr RAFT GRPC" once it listens; it is told "peers A1 A2 A3" (the
// Raft addresses) and starts its voter; asked "role" it answers "leader"
// or "follower"; told "run W D" it answers "result {json}" after W writers
// ran for D in it.
func floorProcesses(b *testing.B, writers int, d time.Duration, grpcClient bool) floorResult {
	var children []*floorChild
	var raftAddrs []string
	for i := range 3 {
		c := startFloorChild(b, fmt.Sprintf("n%d", i+1))
		children = append(children, c)
		f := strings.Fields(c.line(b))
		if len(f) != 3 || f[0] != "addr" {
			b.Fatalf("voter n%d did not say its addresses: %q", i+1, f)
		}
		c.grpcAddr = f[2]
		raftAddrs = append(raftAddrs, f[1])
	}
	for _, c := range children {
		fmt.Fprintf(c.in, "peers %s\n", strings.Join(raftAddrs, " "))
	}
	var leader *floorChild
	for _, c := range children {
		fmt.Fprintln(c.in, "role")
		switch r := c.line(b); r {
		case "leader":
			leader = c
		case "follower":
		default:
			return floorResult{Err: fmt.Sprintf("a voter answered %q", r)}
		}
	}
	if leader == nil {
		return floorResult{Err: "no voter was the leader"}
	}
	if grpcClient {
		return floorLoop(writers, d, func() (func() error, error) { return grpcWriter(b, leader.grpcAddr) })
	}
	fmt.Fprintf(leader.in, "run %d %s\n", writers, d)
	js, ok := strings.CutPrefix(leader.line(b), "result ")
	if !ok {
		return floorResult{Err: "the leader gave no result"}
	}
	var r floorResult
	if err := json.Unmarshal([]byte(js), &r); err != nil {
		return floorResult{Err: fmt.Sprintf("the leader's result %q: %v", js, err)}
	}
	return r
}

// floorChild is a voter process of floorProcesses.
type floorChild struct {
	in       io.WriteCloser
	out      *bufio.Scanner
	grpcAddr string
}

func startFloorChild(b *testing.B, id string) *floorChild {
	cmd := exec.Command(os.Args[0], "-test.run=^TestRaftFloorVoter$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("TXMQ_RAFT_FLOOR_VOTER=%s,%s", id, b.TempDir()))
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
	b.Cleanup(func() {
		// Closing stdin ends the voter; one that does not end soon is
		// killed.
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return &floorChild{in: in, out: bufio.NewScanner(out)}
}

// line reads one line of the child's output; it fails the benchmark when
// the child ended.
func (c *floorChild) line(b *testing.B) string {
	if !c.out.Scan() {
		b.Fatalf("a voter process ended: %v", c.out.Err())
	}
	return c.out.Text()
}

// TestRaftFloorVoter is one voter process of BenchmarkRaftFloor; it does
// nothing unless that benchmark started it.
func TestRaftFloorVoter(t *testing.T) {
	spec := os.Getenv("TXMQ_RAFT_FLOOR_VOTER")
	if spec == "" {
		t.Skip("a voter process of BenchmarkRaftFloor, started by it")
	}
	id, dir, _ := strings.Cut(spec, ",")
	raftLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("addr %s %s\n", raftLn.Addr(), grpcLn.Addr())
	srv := grpc.NewServer(window.ServerOptions()...)
	in := bufio.NewScanner(os.Stdin)
	var v *floorVoter
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 4 && f[0] == "peers" && v == nil:
			if v, err = startFloorVoter(id, dir, raftLn, floorServers(f[1:])); err != nil {
				t.Fatal(err)
			}
			srv.RegisterService(&floorService, v)
			go srv.Serve(grpcLn)
		case len(f) == 1 && f[0] == "role" && v != nil:
			leader, err := v.waitRole()
			switch {
			case err != nil:
				fmt.Println(err)
			case leader:
				fmt.Println("leader")
			default:
				fmt.Println("follower")
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
			js, _ := json.Marshal(floorLoop(writers, d, func() (func() error, error) { return v.write, nil }))
			fmt.Printf("result %s\n", js)
		default:
			t.Fatalf("voter %s: unexpected %q", id, in.Text())
		}
	}
	// The benchmark closed stdin: it is done with this voter. Exit without
	// the leak check, which a voter's Raft goroutines would fail.
	srv.Stop()
	if v != nil {
		v.close()
	}
	os.Exit(0)
}

// nopFSM applies nothing: the floor measures the log, not the store.
type nopFSM struct{}

func (nopFSM) Apply(*raft.Log) any                 { return nil }
func (nopFSM) Snapshot() (raft.FSMSnapshot, error) { return nopSnap{}, nil }
func (nopFSM) Restore(r io.ReadCloser) error       { return r.Close() }

type nopSnap struct{}

func (nopSnap) Persist(s raft.SnapshotSink) error { return s.Close() }
func (nopSnap) Release()                          {}
