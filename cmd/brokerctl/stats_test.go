package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/syncbuf"
	"github.com/txmq/txmq/raftlog"
)

var statsT0 = time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

// statsAt is a leader's snapshot at t0+at whose counters are scaled by n.
func statsAt(node string, term uint64, at time.Duration, n uint64) *txmqv1.GetStatsResponse {
	return &txmqv1.GetStatsResponse{
		TakenAt: timestamppb.New(statsT0.Add(at)), NodeId: node, Term: term, CommitIndex: 100 * n, AppliedIndex: 100 * n,
		Topics: []*txmqv1.TopicStats{{Topic: "orders", Committed: 10 * n}},
		ProducerGroups: []*txmqv1.ProducerGroupStats{{
			ProducerGroup: "shop", Pending: 3, OldestPendingAge: durationpb.New(75 * time.Second), Expired: 1, Instances: 2,
			CommittedTotal: 8 * n, RolledBackTotal: 2 * n, ChecksTotal: 4 * n, CheckErrorsTotal: n,
		}},
		ConsumerGroups: []*txmqv1.ConsumerGroupStats{{
			Topic: "orders", ConsumerGroup: "points", Lag: 5, LagAge: durationpb.New(3 * time.Second), InFlight: 2, Subscribers: 1,
			Retrying: 1, DeadLetters: 1, DeliveredTotal: 12 * n, AckedTotal: 10 * n, RedeliveredTotal: 2 * n, DeadLetteredTotal: n,
		}},
	}
}

// scriptStats makes f answer GetStats with snaps in turn; the last one
// repeats.
func (f *fakeBroker) scriptStats(snaps ...*txmqv1.GetStatsResponse) {
	var mu sync.Mutex
	f.stats = func(*txmqv1.GetStatsRequest) (*txmqv1.GetStatsResponse, error) {
		mu.Lock()
		defer mu.Unlock()
		s := snaps[0]
		if len(snaps) > 1 {
			snaps = snaps[1:]
		}
		return s, nil
	}
}

func TestStatsOneFrame(t *testing.T) {
	f := &fakeBroker{}
	// Two seconds apart, the counters doubled: each rate is the count over 2 s.
	f.scriptStats(statsAt("n1", 3, 0, 1), statsAt("n1", 3, 2*time.Second, 2))
	r := brokerctl(t, nil, "--addr", f.start(t), "stats", "--interval", "1ms")
	wantOK(t, r)
	wantRequests(t, f, &txmqv1.GetStatsRequest{}, &txmqv1.GetStatsRequest{})
	want := `leader n1  term 3  commit 200  applied 200  at 2026-05-01T10:00:02Z  rates per second over 2s

TOPIC   COMMITTED  COMMIT/S
orders  20         5.0

PRODUCER-GROUP  PENDING  OLDEST  EXPIRED  INSTANCES  COMMIT/S  ROLLBACK/S  EXPIRE/S  CHECK/S  CHECK-ERR/S
shop            3        1m15s   1        2          4.0       1.0         0.0       2.0      0.5

TOPIC   CONSUMER-GROUP  LAG  LAG-AGE  IN-FLIGHT  SUBSCRIBERS  RETRYING  DLQ  DELIVER/S  ACK/S  REDELIVER/S  DLQ/S
orders  points          5    3s       2          1            1         1    6.0        5.0    1.0          0.5
`
	if r.stdout != want {
		t.Fatalf("stats printed:\n%s\nwant:\n%s", r.stdout, want)
	}
}

func TestStatsJSONAndLeaderChange(t *testing.T) {
	f := &fakeBroker{}
	// A new leader starts its counters again: no rate across the change.
	f.scriptStats(statsAt("n1", 3, 0, 5), statsAt("n2", 4, 2*time.Second, 1))
	r := brokerctl(t, nil, "--addr", f.start(t), "-o", "json", "stats", "--interval", "1ms")
	wantOK(t, r)
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if got.Leader != "n2" || got.Term != 4 || got.IntervalS != 2 || len(got.ConsumerGroups) != 1 || len(got.ProducerGroups) != 1 {
		t.Fatalf("stats -o json: %+v", got)
	}
	if got.Topics[0].CommitRate != nil || got.ConsumerGroups[0].AckRate != nil || got.ProducerGroups[0].CommitRate != nil {
		t.Fatalf("rates across a leader change: %s", r.stdout)
	}
	if got.ConsumerGroups[0].LagAge != "3s" || got.ProducerGroups[0].OldestPendingAge != "1m15s" {
		t.Fatalf("ages: %s", r.stdout)
	}
}

// --watch prints a frame per interval, blank-line separated when stdout is
// not a terminal, until interrupted, which is a success.
func TestStatsWatch(t *testing.T) {
	f := &fakeBroker{}
	f.scriptStats(statsAt("n1", 3, 0, 1), statsAt("n1", 3, time.Second, 2), statsAt("n1", 3, 2*time.Second, 3))
	addr := f.start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--addr", addr, "stats", "--watch", "--interval", "5ms"}, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for strings.Count(stdout.String(), "leader n1") < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 frames in 10s:\n%s", stdout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != exitOK || stderr.String() != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
	out := stdout.String()
	if strings.Contains(out, clearScreen) {
		t.Fatal("a pipe gets no escape codes")
	}
	if !strings.Contains(out, "rates per second over 1s") || !strings.Contains(out, "\n\nleader n1") {
		t.Fatalf("frames:\n%s", out)
	}
}

func TestStatsUsage(t *testing.T) {
	f := &fakeBroker{}
	addr := f.start(t)
	r := brokerctl(t, nil, "--addr", addr, "stats", "--interval", "0s")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--interval must be positive") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	f.follow("")
	r = brokerctl(t, nil, "--addr", addr, "--timeout", "300ms", "stats", "--interval", "1ms")
	if r.code != exitFailure || !strings.Contains(r.stderr, "Unavailable") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// stats against a real broker: one committed message, acked, one pending
// half message.
func TestStatsRealBroker(t *testing.T) {
	b, err := broker.Open(broker.Config{
		Raft: raftlog.Config{
			NodeID: "n1", Dir: t.TempDir(), RaftAddr: "127.0.0.1:0", Bootstrap: true,
			HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
			LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		},
		GRPCAddr: "127.0.0.1:0",
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	addr := b.Addr()
	wantOK(t, brokerctl(t, nil, "--addr", addr, "half", "send", "orders", "x", "--group", "shop", "--tx", "t1"))
	wantOK(t, brokerctl(t, nil, "--addr", addr, "send", "orders", "paid"))
	wantOK(t, brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--count", "1"))
	r := brokerctl(t, nil, "--addr", addr, "-o", "json", "stats", "--interval", "10ms")
	wantOK(t, r)
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if got.Leader != "n1" || len(got.Topics) != 1 || got.Topics[0].Committed != 1 || got.Topics[0].CommitRate == nil {
		t.Fatalf("topics: %s", r.stdout)
	}
	if len(got.ProducerGroups) != 1 || got.ProducerGroups[0].Pending != 1 || got.ProducerGroups[0].OldestPendingAge == "" {
		t.Fatalf("producer groups: %s", r.stdout)
	}
	if len(got.ConsumerGroups) != 1 || got.ConsumerGroups[0].Lag != 0 || got.ConsumerGroups[0].ConsumerGroup != "points" {
		t.Fatalf("consumer groups: %s", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "stats", "--interval", "10ms")
	wantOK(t, r)
	if !strings.Contains(r.stdout, "leader n1") || !strings.Contains(r.stdout, "shop") || !strings.Contains(r.stdout, "points") {
		t.Fatalf("stats printed:\n%s", r.stdout)
	}
}
