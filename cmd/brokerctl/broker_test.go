package main

import (
	"context"
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
	// Lookups by transaction and of committed messages are leader reads too.
	for _, args := range [][]string{{"half", "show", "--group", "shop", "--tx", "order-1:paid"}, {"msg", "get", "--id", id}, {"consume", "orders", "--peek", "--count", "1"}} {
		r = brokerctl(t, nil, append([]string{"--addr", follower}, args...)...)
		wantOK(t, r)
		if !strings.Contains(r.stdout, id) {
			t.Fatalf("%q through a follower printed:\n%s", args, r.stdout)
		}
	}
}

// realBroker starts a single-node broker in the test's process, changed
// by configure when given, and waits until it leads.
func realBroker(t *testing.T, configure ...func(*broker.Config)) *broker.Broker {
	t.Helper()
	cfg := broker.Config{
		Raft: raftlog.Config{
			NodeID: "n1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true,
			HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
			LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		},
		GRPCAddr: "127.0.0.1:0",
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for _, f := range configure {
		f(&cfg)
	}
	b, err := broker.Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// The dead-letter drill of docs/operations.md against a real broker: nack a
// message into the DLQ, see it in group describe and dlq list/show, redrive
// it, consume it once more, and reset the group.
func TestRealDeadLetterDrill(t *testing.T) {
	b := realBroker(t)
	ctl := func(args ...string) string {
		t.Helper()
		r := brokerctl(t, nil, append([]string{"--addr", b.Addr()}, args...)...)
		wantOK(t, r)
		return r.stdout
	}
	id := strings.TrimSpace(ctl("send", "drill", "order-42", "--ordering-key", "user-7"))
	ctl("consume", "drill", "--group", "points", "--count", "1")
	ctl("group", "reset", "points", "--to", "earliest", "-f")
	ctl("group", "config", "points", "--max-deliveries", "2", "--redelivery-backoff", "0s")
	for attempt := 1; attempt <= 2; attempt++ {
		out := ctl("consume", "drill", "--group", "points", "--count", "1", "--nack")
		for _, want := range []string{id, fmt.Sprintf("attempt=%d", attempt), "ordering-key=user-7"} {
			if !strings.Contains(out, want) {
				t.Fatalf("consume --nack, attempt %d, printed %q; want %q in it", attempt, out, want)
			}
		}
	}
	var out string
	for deadline := time.Now().Add(10 * time.Second); ; {
		out = ctl("dlq", "list", "points")
		if strings.Contains(out, id) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !strings.Contains(out, id) || !strings.Contains(out, "nacked by brokerctl consume --nack") {
		t.Fatalf("dlq list printed:\n%s", out)
	}
	if out := ctl("dlq", "show", "points", id); !strings.Contains(out, "order-42") {
		t.Fatalf("dlq show printed:\n%s", out)
	}
	if out := ctl("group", "describe", "points"); !strings.Contains(out, "DLQ") {
		t.Fatalf("group describe printed:\n%s", out)
	}
	if out := ctl("dlq", "redrive", "points", "--all"); !strings.Contains(out, "1") {
		t.Fatalf("dlq redrive printed:\n%s", out)
	}
	out = ctl("consume", "drill", "--group", "points", "--count", "1")
	if !strings.Contains(out, id) || !strings.Contains(out, "attempt=1") {
		t.Fatalf("after redrive, consume printed:\n%s", out)
	}
	if out := ctl("dlq", "list", "points"); strings.Contains(out, id) {
		t.Fatalf("the redriven and acked message is still in the DLQ:\n%s", out)
	}
	out = ctl("group", "reset", "points", "--to", "earliest", "--dry-run")
	if !strings.Contains(strings.ToLower(out), "dry run") {
		t.Fatalf("reset --dry-run printed:\n%s", out)
	}
}
