package txmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// newTestConsumer returns a consumer closed when the test ends.
func newTestConsumer(t *testing.T, cfg ConsumerConfig) *Consumer {
	t.Helper()
	if cfg.Topic == "" {
		cfg.Topic = "orders"
	}
	if cfg.Group == "" {
		cfg.Group = "billing"
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger
	}
	if cfg.ReconnectBackoff == 0 {
		cfg.ReconnectBackoff = 200 * time.Millisecond
	}
	c, err := NewConsumer(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// startRun runs c.Run in the background. The returned func cancels it and
// returns Run's result; it is also called when the test ends, so Run never
// outlives the test.
func startRun(t *testing.T, c *Consumer, h Handler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Error("Run did not return after its context was cancelled")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// seen records the deliveries a handler got, safely across goroutines.
type seen struct {
	mu  sync.Mutex
	ids []string
}

func (s *seen) add(d *Delivery) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, d.MessageID)
}

func (s *seen) list() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ids)
}

func TestConsumerAcksAndNacks(t *testing.T) {
	committed := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	deadline := time.Now().Add(time.Hour).Truncate(time.Microsecond).UTC()
	f := &fakeConsumer{script: func(s *fakeSession) error {
		for _, id := range []string{"m-fail", "m-retry", "m-wrapped"} {
			if err := s.deliver(id, 1); err != nil {
				return err
			}
		}
		if err := s.send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: &txmqv1.Delivery{
			MessageId: "m-ok", Topic: "orders", Key: "order-42", Properties: map[string]string{"k": "v"},
			Body: []byte("paid"), Attempt: 3, CommittedAt: timestamppb.New(committed), Sequence: 9,
			ProducerGroup: "shop", TransactionId: "order-42:paid", OrderingKey: "order-42",
			AckDeadline: timestamppb.New(deadline), LastError: "database down",
		}}}); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}, Start: StartLatest, Prefetch: 8})

	var got seen
	var ok *Delivery
	stop := startRun(t, c, func(_ context.Context, d *Delivery) error {
		got.add(d)
		switch d.MessageID {
		case "m-fail":
			return errors.New("database down")
		case "m-retry":
			return RetryAfter(errors.New("rate limited"), 10*time.Second)
		case "m-wrapped":
			return fmt.Errorf("points: %w", RetryAfter(nil, -time.Second))
		}
		ok = d
		return nil
	})

	// Concurrency 1 runs the deliveries in order, and outcomes go out in
	// order, so once m-ok's ack arrived the nacks have too.
	waitFor(t, "the ack of m-ok", func() bool { return slices.Contains(f.Acked(1), "m-ok") })
	require.Equal(t, []string{"m-ok"}, f.Acked(1))
	require.Equal(t, []string{"m-fail", "m-retry", "m-wrapped", "m-ok"}, got.list())
	nacks := f.Nacks(1)
	require.Len(t, nacks, 3)
	require.Equal(t, []string{"m-fail"}, nacks[0].GetMessageIds())
	require.Equal(t, "database down", nacks[0].GetError())
	require.Nil(t, nacks[0].GetDelay(), "no delay: the group's backoff applies")
	require.Equal(t, []string{"m-retry"}, nacks[1].GetMessageIds())
	require.Equal(t, "rate limited", nacks[1].GetError())
	require.Equal(t, 10*time.Second, nacks[1].GetDelay().AsDuration())
	require.Equal(t, []string{"m-wrapped"}, nacks[2].GetMessageIds())
	require.Equal(t, "points: retry after 0s", nacks[2].GetError())
	require.NotNil(t, nacks[2].GetDelay())
	require.Zero(t, nacks[2].GetDelay().AsDuration(), "a negative delay is clamped to 0")
	require.Empty(t, f.Extends(1), "deliveries without a deadline are not extended")

	require.NotNil(t, ok.t, "a delivery from a consumer can be extended")
	ok.t = nil
	require.Equal(t, &Delivery{
		MessageID: "m-ok", Topic: "orders", Group: "billing", Key: "order-42", OrderingKey: "order-42",
		Properties: map[string]string{"k": "v"}, Body: []byte("paid"), Attempt: 3, LastError: "database down",
		AckDeadline: deadline, CommittedAt: committed, Sequence: 9,
		ProducerGroup: "shop", TransactionID: "order-42:paid",
	}, ok)

	start := f.Session(1).start
	require.Equal(t, "orders", start.GetTopic())
	require.Equal(t, "billing", start.GetConsumerGroup())
	require.Equal(t, txmqv1.StartPosition_START_POSITION_LATEST, start.GetStartPosition())
	require.Nil(t, start.GetStartTime())
	require.Equal(t, uint32(8), start.GetMaxInFlight())

	require.NoError(t, stop())
}

func TestConsumerStartAt(t *testing.T) {
	f := &fakeConsumer{script: untilStreamEnds}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	at := time.Date(2026, 11, 30, 4, 0, 0, 0, time.UTC)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}, StartAt: at})
	stop := startRun(t, c, func(context.Context, *Delivery) error { return nil })
	waitFor(t, "a subscription", func() bool { return f.SessionCount() == 1 })
	start := f.Session(1).start
	require.Equal(t, txmqv1.StartPosition_START_POSITION_TIMESTAMP, start.GetStartPosition())
	require.Equal(t, at, start.GetStartTime().AsTime())
	require.Equal(t, uint32(64), start.GetMaxInFlight(), "the default prefetch")
	require.NoError(t, stop())
}

// A slow handler's delivery, and the one waiting for its handler slot, are
// extended in one request each time, before their deadline, until they have
// been pending for MaxExtension; then the deadline is left to pass.
func TestConsumerExtendsDeadlines(t *testing.T) {
	const (
		window = time.Second // the group's ack deadline, at its shortest
		// Not a multiple of the extension period (2/3 of window), so
		// that the client's and the fake's clocks agree on the last one.
		maxExtension = 1800 * time.Millisecond
	)
	var arrived atomic.Int64
	f := &fakeConsumer{script: func(s *fakeSession) error {
		now := time.Now()
		arrived.Store(now.UnixNano())
		for _, id := range []string{"m-1", "m-2"} {
			if err := s.send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: &txmqv1.Delivery{
				MessageId: id, Topic: "orders", Attempt: 1, Body: []byte("x"), AckDeadline: timestamppb.New(now.Add(window)),
			}}}); err != nil {
				return err
			}
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}, MaxExtension: maxExtension})

	release := make(chan struct{})
	stop := startRun(t, c, func(ctx context.Context, d *Delivery) error {
		if d.MessageID == "m-1" {
			<-release
		}
		return nil
	})

	// The broker's deadline for both: the first one, then an ack deadline
	// after each extension it received.
	lapsed := func() (deadline time.Time, lapsed bool) {
		deadline = time.Unix(0, arrived.Load()).Add(window)
		for _, e := range f.Extends(1) {
			deadline = e.at.Add(window)
		}
		return deadline, arrived.Load() != 0 && time.Now().After(deadline.Add(window/2))
	}
	waitFor(t, "the deadline to lapse once extensions stopped", func() bool {
		_, ok := lapsed()
		return ok
	})
	close(release)
	waitFor(t, "both acked", func() bool { return len(f.Acked(1)) == 2 })

	start := time.Unix(0, arrived.Load())
	extends := f.Extends(1)
	require.GreaterOrEqual(t, len(extends), 2, "extended more than once")
	deadline := start.Add(window)
	for i, e := range extends {
		require.ElementsMatch(t, []string{"m-1", "m-2"}, e.req.GetMessageIds(), "extension %d batches both deliveries", i)
		require.Nil(t, e.req.GetExtension(), "extension %d asks for the group's ack deadline", i)
		require.True(t, e.at.Before(deadline), "extension %d came %v after the deadline", i, e.at.Sub(deadline))
		require.Less(t, e.at.Sub(start), maxExtension, "extension %d came after MaxExtension", i)
		deadline = e.at.Add(window)
	}
	last, _ := lapsed()
	require.GreaterOrEqual(t, last.Sub(start), maxExtension, "extensions stopped early")
	require.NoError(t, stop())
}

func TestDeliveryExtend(t *testing.T) {
	f := &fakeConsumer{script: func(s *fakeSession) error {
		if err := s.deliver("m-1", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})

	handled := make(chan *Delivery, 1)
	stop := startRun(t, c, func(ctx context.Context, d *Delivery) error {
		require.ErrorIs(t, d.Extend(ctx, 0), ErrInvalidArgument)
		require.ErrorIs(t, d.Extend(ctx, 13*time.Hour), ErrInvalidArgument)
		require.NoError(t, d.Extend(ctx, 5*time.Minute))
		handled <- d
		return nil
	})
	d := <-handled
	waitFor(t, "the ack", func() bool { return len(f.Acked(1)) == 1 })
	extends := f.Extends(1)
	require.Len(t, extends, 1)
	require.Equal(t, []string{"m-1"}, extends[0].req.GetMessageIds())
	require.Equal(t, 5*time.Minute, extends[0].req.GetExtension().AsDuration())
	require.ErrorContains(t, d.Extend(t.Context(), time.Minute), "already acked or nacked")
	require.ErrorIs(t, (&Delivery{MessageID: "x"}).Extend(t.Context(), time.Minute), ErrInvalidArgument)
	require.NoError(t, stop())
}

func TestOutcomeRequests(t *testing.T) {
	five, zero := 5*time.Second, time.Duration(0)
	reqs := requests([]outcome{
		{kind: outcomeAck, ids: []string{"a1"}},
		{kind: outcomeNack, ids: []string{"n1"}, errText: "boom"},
		{kind: outcomeExtend, ids: []string{"e1", "e2"}},
		{kind: outcomeNack, ids: []string{"n2"}, errText: "boom", delay: &zero},
		{kind: outcomeAck, ids: []string{"a2"}},
		{kind: outcomeNack, ids: []string{"n3"}, errText: "boom"},
		{kind: outcomeExtend, ids: []string{"e3"}, extension: &five},
		{kind: outcomeExtend, ids: []string{"e4"}},
	})
	require.Len(t, reqs, 5)
	require.Equal(t, []string{"e1", "e2", "e4"}, reqs[0].GetExtend().GetMessageIds())
	require.Nil(t, reqs[0].GetExtend().GetExtension())
	require.Equal(t, []string{"e3"}, reqs[1].GetExtend().GetMessageIds())
	require.Equal(t, five, reqs[1].GetExtend().GetExtension().AsDuration())
	require.Equal(t, []string{"n1", "n3"}, reqs[2].GetNack().GetMessageIds())
	require.Nil(t, reqs[2].GetNack().GetDelay())
	require.Equal(t, []string{"n2"}, reqs[3].GetNack().GetMessageIds())
	require.NotNil(t, reqs[3].GetNack().GetDelay())
	require.Equal(t, []string{"a1", "a2"}, reqs[4].GetAck().GetMessageIds())

	// A terminate never shares a request with a plain nack of the same
	// text: it would dead-letter the other, or fail to dead-letter itself.
	reqs = requests([]outcome{
		nack("n1", errors.New("boom")),
		nack("t1", Terminate(errors.New("boom"))),
		nack("n2", errors.New("boom")),
		nack("t2", RetryAfter(Terminate(errors.New("boom")), time.Minute)),
	})
	require.Len(t, reqs, 2)
	require.Equal(t, []string{"n1", "n2"}, reqs[0].GetNack().GetMessageIds())
	require.False(t, reqs[0].GetNack().GetTerminate())
	require.Equal(t, []string{"t1", "t2"}, reqs[1].GetNack().GetMessageIds())
	require.True(t, reqs[1].GetNack().GetTerminate())
	require.Nil(t, reqs[1].GetNack().GetDelay(), "Terminate wins over RetryAfter")
}

func TestNackErrorTextIsBounded(t *testing.T) {
	long := strings.Repeat("é", maxErrorText) // two bytes each
	o := nack("m", errors.New(long))
	require.Len(t, o.errText, maxErrorText)
	require.True(t, utf8.ValidString(o.errText))
	require.Equal(t, "short", nack("m", errors.New("short")).errText)
	require.Equal(t, 12*time.Hour, *nack("m", RetryAfter(nil, 24*time.Hour)).delay)
}

func TestConsumerResubscribesWhenTheStreamEnds(t *testing.T) {
	for name, end := range map[string]error{
		"cleanly":     nil,
		"unavailable": status.Error(codes.Unavailable, "leader stepped down"),
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeConsumer{script: func(s *fakeSession) error {
				if s.n == 1 {
					if err := s.deliver("m-1", 1); err != nil {
						return err
					}
					if err := s.waitAck("m-1"); err != nil {
						return err
					}
					return end
				}
				if err := s.deliver("m-2", 1); err != nil {
					return err
				}
				return untilStreamEnds(s)
			}}
			_, addr := startConsumerServer(t, "127.0.0.1:0", f)
			c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})
			var got seen
			stop := startRun(t, c, func(_ context.Context, d *Delivery) error {
				got.add(d)
				return nil
			})

			waitFor(t, "m-2 acked on the second subscription", func() bool { return slices.Contains(f.Acked(2), "m-2") })
			require.Equal(t, []string{"m-1"}, f.Acked(1))
			require.Equal(t, []string{"m-1", "m-2"}, got.list())
			require.NoError(t, stop())
		})
	}
}

func TestConsumerSurvivesBrokerRestart(t *testing.T) {
	first := &fakeConsumer{script: func(s *fakeSession) error {
		if err := s.deliver("m-1", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	srv, addr := startConsumerServer(t, "127.0.0.1:0", first)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})
	var got seen
	stop := startRun(t, c, func(_ context.Context, d *Delivery) error {
		got.add(d)
		return nil
	})
	waitFor(t, "m-1 acked", func() bool { return slices.Contains(first.Acked(1), "m-1") })

	srv.Stop()
	second := &fakeConsumer{script: func(s *fakeSession) error {
		if err := s.deliver("m-2", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	startConsumerServer(t, addr, second)

	waitFor(t, "m-2 acked by the restarted broker", func() bool { return slices.Contains(second.Acked(1), "m-2") })
	require.Equal(t, []string{"m-1", "m-2"}, got.list())
	require.NoError(t, stop())
}

func TestConsumerDropsAcksOfDeadStream(t *testing.T) {
	breakStream := make(chan struct{})
	f := &fakeConsumer{script: func(s *fakeSession) error {
		if s.n == 1 {
			if err := s.deliver("m-1", 1); err != nil {
				return err
			}
			<-breakStream
			return status.Error(codes.Unavailable, "leader stepped down")
		}
		if err := s.deliver("m-2", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})

	started, release := make(chan struct{}), make(chan struct{})
	var got seen
	stop := startRun(t, c, func(_ context.Context, d *Delivery) error {
		got.add(d)
		if d.MessageID == "m-1" {
			close(started)
			<-release
		}
		return nil
	})

	<-started
	close(breakStream)
	waitFor(t, "a second subscription", func() bool { return f.SessionCount() == 2 })
	close(release)

	// m-2 waits for m-1's handler (Concurrency 1), so by the time m-2 is
	// acked, m-1's ack was either sent or dropped.
	waitFor(t, "m-2 acked", func() bool { return slices.Contains(f.Acked(2), "m-2") })
	require.Equal(t, []string{"m-2"}, f.Acked(2))
	require.Empty(t, f.Acked(1))
	require.Equal(t, []string{"m-1", "m-2"}, got.list())
	require.NoError(t, stop())
}

func TestConsumerFollowsNotLeader(t *testing.T) {
	leader := &fakeConsumer{script: func(s *fakeSession) error {
		if err := s.deliver("m-1", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	_, leaderAddr := startConsumerServer(t, "127.0.0.1:0", leader)
	refusal := notLeaderErr(t, leaderAddr)
	follower := &fakeConsumer{refuse: func(int) error { return refusal }}
	_, followerAddr := startConsumerServer(t, "127.0.0.1:0", follower)

	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{followerAddr}})
	stop := startRun(t, c, func(context.Context, *Delivery) error { return nil })
	waitFor(t, "m-1 acked on the leader", func() bool { return slices.Contains(leader.Acked(1), "m-1") })
	require.Equal(t, 1, follower.SessionCount())
	require.NoError(t, stop())
}

func TestConsumerReturnsPermanentErrors(t *testing.T) {
	f := &fakeConsumer{refuse: func(int) error {
		return status.Error(codes.NotFound, `topic "orders" does not exist`)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := c.Run(ctx, func(context.Context, *Delivery) error { return nil })
	require.ErrorIs(t, err, ErrNotFound)
	require.Contains(t, err.Error(), `topic "orders" does not exist`)
	require.Equal(t, 1, f.SessionCount(), "not retried")
}

func TestConsumerConcurrency(t *testing.T) {
	const deliveries = 4
	f := &fakeConsumer{script: func(s *fakeSession) error {
		for i := range deliveries {
			if err := s.deliver(string(rune('a'+i)), 1); err != nil {
				return err
			}
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}, Concurrency: 2})

	var running, most atomic.Int32
	release := make(chan struct{})
	stop := startRun(t, c, func(context.Context, *Delivery) error {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		<-release
		return nil
	})

	waitFor(t, "two handlers in parallel", func() bool { return running.Load() == 2 })
	close(release)
	waitFor(t, "every delivery acked", func() bool { return len(f.Acked(1)) == deliveries })
	require.Equal(t, int32(2), most.Load())
	require.NoError(t, stop())
}

func TestConsumerStopsWithHandlersRunning(t *testing.T) {
	f := &fakeConsumer{script: func(s *fakeSession) error {
		if err := s.deliver("m-1", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)

	t.Run("cancel", func(t *testing.T) {
		c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})
		inHandler := make(chan struct{})
		var handlerDone atomic.Bool
		stop := startRun(t, c, func(ctx context.Context, _ *Delivery) error {
			close(inHandler)
			<-ctx.Done()
			handlerDone.Store(true)
			return ctx.Err()
		})
		<-inHandler
		require.NoError(t, stop())
		require.True(t, handlerDone.Load(), "Run waited for the handler")
	})

	t.Run("close", func(t *testing.T) {
		c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}})
		inHandler := make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- c.Run(context.Background(), func(ctx context.Context, _ *Delivery) error {
				close(inHandler)
				<-ctx.Done()
				return ctx.Err()
			})
		}()
		<-inHandler
		require.ErrorIs(t, c.Run(t.Context(), func(context.Context, *Delivery) error { return nil }), errRunning)
		require.NoError(t, c.Close())
		require.ErrorIs(t, <-done, ErrClosed)
		require.ErrorIs(t, c.Run(t.Context(), func(context.Context, *Delivery) error { return nil }), ErrClosed)
	})
}

func TestNewConsumerValidates(t *testing.T) {
	for name, cfg := range map[string]ConsumerConfig{
		"empty topic":          {Group: "billing"},
		"bad topic":            {Topic: "order events", Group: "billing"},
		"missing group":        {Topic: "orders"},
		"bad start":            {Topic: "orders", Group: "billing", Start: StartPosition(7)},
		"negative prefetch":    {Topic: "orders", Group: "billing", Prefetch: -1},
		"prefetch too large":   {Topic: "orders", Group: "billing", Prefetch: 10001},
		"start twice":          {Topic: "orders", Group: "billing", Start: StartLatest, StartAt: time.Now()},
		"negative concurrency": {Topic: "orders", Group: "billing", Concurrency: -1},
		"negative backoff":     {Topic: "orders", Group: "billing", ReconnectBackoff: -time.Second},
		"empty address":        {Topic: "orders", Group: "billing", Addrs: []string{""}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewConsumer(cfg)
			require.ErrorIs(t, err, ErrInvalidArgument)
		})
	}
	c := newTestConsumer(t, ConsumerConfig{})
	require.ErrorIs(t, c.Run(t.Context(), nil), ErrInvalidArgument)
}

// The broker ends a stream while deliveries are still arriving and the
// handler slots are full: the acks can no longer be sent, and the consumer
// must notice and subscribe again instead of waiting for a free slot.
func TestConsumerResubscribesWhenAcksCannotBeSent(t *testing.T) {
	f := &fakeConsumer{script: func(s *fakeSession) error {
		if s.n == 1 {
			for i := 0; i < 20; i++ {
				if err := s.deliver(fmt.Sprint("m-", i), 1); err != nil {
					return err
				}
			}
			return status.Error(codes.Unavailable, "leader stepped down")
		}
		if err := s.deliver("after", 1); err != nil {
			return err
		}
		return untilStreamEnds(s)
	}}
	_, addr := startConsumerServer(t, "127.0.0.1:0", f)
	c := newTestConsumer(t, ConsumerConfig{Addrs: []string{addr}, Concurrency: 1})
	var got seen
	stop := startRun(t, c, func(_ context.Context, d *Delivery) error {
		got.add(d)
		return nil
	})
	waitFor(t, "the delivery of the second subscription", func() bool { return slices.Contains(got.list(), "after") })
	require.NoError(t, stop())
}

// handled runs session.handle for a delivery of id whose handler returns
// err, as the dispatcher would, and returns the outcome it queued.
func handled(s *session, id string, err error) outcome {
	s.r.h = func(context.Context, *Delivery) error { return err }
	t := &tracked{s: s, d: &Delivery{MessageID: id, Attempt: 2}}
	s.mu.Lock()
	s.pending[t] = struct{}{}
	s.mu.Unlock()
	s.r.sem <- struct{}{}
	s.handle(t)
	return <-s.out
}

func newHandleSession(ctx context.Context, log *slog.Logger) *session {
	return &session{r: &run{ctx: ctx, sem: make(chan struct{}, 1)}, ctx: ctx, log: log,
		out: make(chan outcome, 1), pending: map[*tracked]struct{}{}}
}

func TestHandleLogsWhatFailsWithItsDelivery(t *testing.T) {
	var buf bytes.Buffer
	s := newHandleSession(t.Context(), slog.New(slog.NewTextHandler(&buf, nil)))

	o := handled(s, "m-ok", nil)
	require.Equal(t, outcomeAck, o.kind)
	require.Empty(t, buf.String(), "an acked delivery logs nothing")

	o = handled(s, "m-fail", errors.New("database down"))
	require.Equal(t, outcomeNack, o.kind)
	require.Contains(t, buf.String(), "level=WARN")
	require.Contains(t, buf.String(), "msg_id=m-fail attempt=2")
	require.Contains(t, buf.String(), `err="database down"`)
}

// BenchmarkHandle is the consumer's own work for one delivery whose
// handler succeeds: running it and queuing the ack.
func BenchmarkHandle(b *testing.B) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil)).With("component", "txmq-consumer", "topic", "orders", "group", "billing")
	s := newHandleSession(b.Context(), log)
	b.ReportAllocs()
	for b.Loop() {
		handled(s, "0123456789abcdef0123456789abcdef", nil)
	}
}
