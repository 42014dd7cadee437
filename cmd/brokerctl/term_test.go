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
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
)

// startRealBroker starts a single-node broker in process and returns its
// gRPC address once it leads.
func startRealBroker(t *testing.T) string {
	t.Helper()
	return startRealBrokerWith(t, nil)
}

// startRealBrokerWith is startRealBroker with its configuration changed
// by configure, when set.
func startRealBrokerWith(t *testing.T, configure func(*broker.Config)) string {
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
	if configure != nil {
		configure(&cfg)
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
	return b.Addr()
}

// Against a real broker: a repeated send says it is a duplicate (on
// stderr, stdout keeping the first ID); a repeat with another body is
// refused, naming the first message, and stores nothing.
func TestRealDuplicateAndMismatch(t *testing.T) {
	addr := startRealBroker(t)
	run := func(args ...string) result {
		t.Helper()
		return brokerctl(t, nil, append([]string{"--addr", addr}, args...)...)
	}
	r := run("send", "orders", "shipped", "--key", "order-1:shipped")
	wantOK(t, r)
	id := strings.TrimSpace(r.stdout)
	r = run("send", "orders", "shipped", "--key", "order-1:shipped")
	if r.code != exitOK || r.stdout != id+"\n" || !strings.Contains(r.stderr, "duplicate of message "+id) {
		t.Fatalf("repeat: exit code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = run("send", "orders", "shipped twice", "--key", "order-1:shipped")
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "brokerctl: FailedPrecondition: ") ||
		!strings.Contains(r.stderr, `key "order-1:shipped" was sent on topic orders as message `+id) {
		t.Fatalf("another body: exit code %d, stderr %q", r.code, r.stderr)
	}

	r = run("half", "send", "orders", "paid", "--group", "shop", "--tx", "order-1:paid")
	wantOK(t, r)
	half := strings.TrimSpace(r.stdout)
	r = run("half", "send", "orders", "paid", "--group", "shop", "--tx", "order-1:paid")
	if r.code != exitOK || r.stdout != half+"\n" || !strings.Contains(r.stderr, "duplicate of message "+half+": transaction order-1:paid of group shop was sent before (now PENDING)") {
		t.Fatalf("half repeat: exit code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = run("half", "send", "refunds", "paid", "--group", "shop", "--tx", "order-1:paid")
	if r.code != exitFailure || !strings.Contains(r.stderr, "is message "+half+", sent with topic orders, not refunds") {
		t.Fatalf("half on another topic: exit code %d, stderr %q", r.code, r.stderr)
	}
	r = run("topic", "list", "-o", "json")
	wantOK(t, r)
	if !strings.Contains(r.stdout, `"topic":"orders"`) || !strings.Contains(r.stdout, `"messages":1`) {
		t.Fatalf("the refused repeats stored something:\n%s", r.stdout)
	}
}

// consume --term dead-letters each message it prints at once, although the
// group allows 16 deliveries; --term and --nack exclude each other.
func TestRealConsumeTerm(t *testing.T) {
	addr := startRealBroker(t)
	run := func(args ...string) result {
		t.Helper()
		return brokerctl(t, nil, append([]string{"--addr", addr}, args...)...)
	}
	r := run("send", "drill", "poison")
	wantOK(t, r)
	id := strings.TrimSpace(r.stdout)
	r = run("consume", "drill", "--group", "points", "--count", "1", "--term")
	wantOK(t, r)
	if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, "attempt=1") {
		t.Fatalf("consume --term printed %q", r.stdout)
	}
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		r := run("dlq", "list", "points", "-o", "json")
		if !strings.Contains(r.stdout, id) || !strings.Contains(r.stdout, `"attempts":1`) || !strings.Contains(r.stdout, termError) {
			return fmt.Errorf("dlq list: %s %s", r.stdout, r.stderr)
		}
		return nil
	})
	r = run("consume", "drill", "--group", "points", "--term", "--nack")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--term and --nack exclude each other") {
		t.Fatalf("exit code %d, stderr %q", r.code, r.stderr)
	}
}
