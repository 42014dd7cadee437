package raftlog

import (
	"io"
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
	clamp := newCommitClamp(server)
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
		rpc.Respond(&raft.AppendEntriesResponse{Term: 3, Success: true}, nil)
	case <-time.After(10 * time.Second):
		t.Fatal("no request came through the clamp")
	}
	if err := <-done; err != nil {
		t.Fatalf("the answer did not go back: %v", err)
	}
}
