package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/raftlog"
)

// A Go producer that answers check-backs over its session, seen through
// brokerctl against a real broker: producer list shows its session
// endpoint, half check asks it over the session, and once it closes it is
// gone from the list at once (its lease is ten minutes).
func TestRealProducerOnItsSession(t *testing.T) {
	b, err := broker.Open(broker.Config{
		Raft: raftlog.Config{
			NodeID: "n1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true,
			HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
			LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		},
		GRPCAddr:  "127.0.0.1:0",
		CheckBack: checkback.Config{HeartbeatInterval: time.Minute, Lease: 10 * time.Minute},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	ctl := func(args ...string) string {
		t.Helper()
		r := brokerctl(t, nil, append([]string{"--addr", b.Addr()}, args...)...)
		wantOK(t, r)
		return r.stdout
	}
	p, err := txmq.NewProducer(txmq.ProducerConfig{
		Addrs: []string{b.Addr()}, ProducerGroup: "shop", InstanceID: "shop-1",
		Checker: func(context.Context, txmq.HalfMessage) (txmq.Resolution, error) { return txmq.Commit, nil },
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	out := ctl("producer", "list")
	if !strings.Contains(out, "shop-1") || !strings.Contains(out, "session://127.0.0.1:") {
		t.Fatalf("producer list printed:\n%s", out)
	}
	if out := ctl("producer", "list", "-o", "json"); !strings.Contains(out, `"session":"127.0.0.1:`) {
		t.Fatalf("producer list --json printed:\n%s", out)
	}

	id := strings.TrimSpace(ctl("half", "send", "orders", "paid", "--group", "shop", "--tx", "order-1:paid"))
	out = ctl("half", "check", id)
	for _, want := range []string{"COMMIT", "shop-1", "session://127.0.0.1:", "COMMITTED"} {
		if !strings.Contains(out, want) {
			t.Fatalf("half check printed %q; want %q in it", out, want)
		}
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; {
		out = ctl("producer", "list")
		if !strings.Contains(out, "shop-1") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("producer list after Close still shows the instance:\n%s", out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
