package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/raftlog"
)

// brokerctl given only a follower's address, against a real three-node
// cluster: writes, half message reads and consume follow the leader.
func TestRealClusterThroughAFollower(t *testing.T) {
	var nodes []*broker.Broker
	for i := 1; i <= 3; i++ {
		cfg := broker.Config{
			Raft: raftlog.Config{
				NodeID: fmt.Sprint("n", i), Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: i == 1,
				HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
				LeaderLeaseTimeout: 200 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
			},
			GRPCAddr: "127.0.0.1:0",
			Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		}
		if i > 1 {
			cfg.Join = []string{nodes[0].Addr()}
		}
		b, err := broker.Open(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		nodes = append(nodes, b)
	}
	var follower string
	deadline := time.Now().Add(20 * time.Second)
	for follower == "" {
		for _, b := range nodes {
			st, err := b.Node().Status()
			if err == nil && len(st.Members) == 3 && st.LeaderID != "" && !b.Node().IsLeader() {
				// Every member answers (so each has announced its address).
				r := brokerctl(t, nil, "--addr", b.Addr(), "cluster", "status")
				if r.code == exitOK && !strings.Contains(r.stdout, "unreachable") {
					follower = b.Addr()
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no follower knowing the whole cluster within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}

	r := brokerctl(t, nil, "--addr", follower, "half", "send", "orders", "paid", "--group", "shop", "--tx", "order-1:paid")
	wantOK(t, r)
	id := strings.TrimSpace(r.stdout)
	wantOK(t, brokerctl(t, nil, "--addr", follower, "half", "commit", id))
	r = brokerctl(t, nil, "--addr", follower, "half", "list", "--state", "committed")
	wantOK(t, r)
	if !strings.Contains(r.stdout, id) {
		t.Fatalf("half list through a follower misses %s:\n%s", id, r.stdout)
	}
	r = brokerctl(t, nil, "--addr", follower, "consume", "orders", "--group", "points", "--count", "1")
	wantOK(t, r)
	if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "paid") {
		t.Fatalf("consume through a follower printed:\n%s", r.stdout)
	}
}
