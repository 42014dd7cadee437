package raftlog

import (
	"io"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

// The case of TestClusterLeaderLosesWhatItSends: "previous entry 29, no
// entries, commit 30" proves nothing past 29.
func TestClampCommit(t *testing.T) {
	entries := func(idx ...uint64) []*raft.Log {
		var out []*raft.Log
		for _, i := range idx {
			out = append(out, &raft.Log{Index: i})
		}
		return out
	}
	for _, c := range []struct {
		name               string
		prev, commit, want uint64
		entries            []*raft.Log
	}{
		{"no entries: up to the previous one", 29, 30, 29, nil},
		{"entries: up to the last of them", 29, 40, 31, entries(30, 31)},
		{"commit behind what is proven stays", 29, 25, 25, entries(30, 31)},
		{"first request of a new log", 0, 3, 0, nil},
		{"first entries of a new log", 0, 3, 2, entries(1, 2)},
	} {
		req := &raft.AppendEntriesRequest{PrevLogEntry: c.prev, LeaderCommitIndex: c.commit, Entries: c.entries}
		clampCommit(req)
		if req.LeaderCommitIndex != c.want {
			t.Errorf("%s: commit %d, want %d", c.name, req.LeaderCommitIndex, c.want)
		}
	}
}

// The clamp sits between the transport and Raft: a request sent over TCP
// reaches Raft through it, corrected, the answer goes back, and Close ends
// its goroutine (the package's leak check sees to that).
func TestCommitClampForwards(t *testing.T) {
	server, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &heldLog{last: math.MaxUint64}
	clamp := newCommitClamp(server, logs)
	defer clamp.Close()
	client, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	done := make(chan error, 1)
	go func() {
		var resp raft.AppendEntriesResponse
		done <- client.AppendEntries("n1", server.LocalAddr(), &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 3, PrevLogEntry: 29, PrevLogTerm: 2, LeaderCommitIndex: 30,
		}, &resp)
	}()
	select {
	case rpc := <-clamp.Consumer():
		req, ok := rpc.Command.(*raft.AppendEntriesRequest)
		if !ok {
			t.Fatalf("got a %T", rpc.Command)
		}
		if req.LeaderCommitIndex != 29 {
			t.Errorf("commit index %d reached Raft, want 29", req.LeaderCommitIndex)
		}
		if n := logs.syncs.Load(); n != 1 {
			t.Errorf("the log was synced %d times before Raft read the request, want 1", n)
		}
		rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true}, nil)
	case <-time.After(10 * time.Second):
		t.Fatal("no request came through the clamp")
	}
	if err := <-done; err != nil {
		t.Fatalf("the answer did not go back: %v", err)
	}
}

// heldLog is a log store whose durable index a test sets.
type heldLog struct {
	last  uint64
	syncs atomic.Int32
}

func (l *heldLog) durable() uint64 { return l.last }
func (l *heldLog) sync()           { l.syncs.Add(1) }

// What a leader sends carries a commit index no higher than what its own
// log holds durably; below that, the request goes as Raft made it.
func TestCommitClampSends(t *testing.T) {
	server, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	transport, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 5*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	logs := &heldLog{last: 25}
	client := newCommitClamp(transport, logs)
	defer client.Close()
	for _, c := range []struct {
		commit, want uint64
	}{{30, 25}, {25, 25}, {20, 20}} {
		done := make(chan error, 1)
		go func() {
			var resp raft.AppendEntriesResponse
			done <- client.AppendEntries("n2", server.LocalAddr(), &raft.AppendEntriesRequest{
				RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax}, Term: 3, PrevLogEntry: 29, PrevLogTerm: 3, LeaderCommitIndex: c.commit,
			}, &resp)
		}()
		select {
		case rpc := <-server.Consumer():
			req := rpc.Command.(*raft.AppendEntriesRequest)
			if req.LeaderCommitIndex != c.want {
				t.Errorf("commit %d with 25 durable: the follower heard %d, want %d", c.commit, req.LeaderCommitIndex, c.want)
			}
			rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true}, nil)
		case <-time.After(10 * time.Second):
			t.Fatal("no request reached the follower")
		}
		if err := <-done; err != nil {
			t.Fatalf("the answer did not come back: %v", err)
		}
	}
}
