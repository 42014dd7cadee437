package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// clock is an injected clock the test moves by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_800_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// advance moves the clock and wakes the dispatchers, which otherwise look
// at the clock once a second.
func (c *clock) advance(b *Broker, d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range b.dispatchers {
		d.poke()
	}
}

func (s *subscription) nack(delay *time.Duration, reason string, ids ...string) {
	s.t.Helper()
	n := &txmqv1.NackRequest{MessageIds: ids, Error: reason}
	if delay != nil {
		n.Delay = durationpb.New(*delay)
	}
	require.NoError(s.t, s.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: n}}))
}

// waitEnd waits for the stream to end and returns its error.
func (s *subscription) waitEnd(timeout time.Duration) error {
	s.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case _, ok := <-s.msgs:
			if !ok {
				return s.err
			}
		case <-deadline:
			s.t.Fatalf("stream still open after %s", timeout)
		}
	}
}

func sendN(t *testing.T, tb *testBroker, topic string, n int, key func(i int) string) []string {
	t.Helper()
	ids := make([]string, n)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Many senders share the fsyncs. With ordering keys, all messages of a
	// key have the same sender, so that commit order is send order within
	// the key (the test's keys are i % keys).
	const senders = 50
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for w := 0; w < senders; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += senders {
				req := &txmqv1.SendRequest{Topic: topic, Body: []byte(fmt.Sprint(i))}
				if key != nil {
					req.OrderingKey = key(i)
				}
				r, err := tb.producer.Send(ctx, req)
				if err != nil {
					errs <- err
					return
				}
				ids[i] = r.MessageId
			}
		}()
	}
	wg.Wait()
	close(errs)
	require.NoError(t, <-errs)
	return ids
}

func describe(t *testing.T, tb *testBroker, group string) *txmqv1.DescribeConsumerGroupResponse {
	t.Helper()
	g, err := tb.admin.DescribeConsumerGroup(ctxT(t), &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: group})
	require.NoError(t, err)
	return g
}

// Three subscribers share 10,000 messages: every message is acked once,
// never in flight at two subscribers at once; when one subscriber dies, its
// deliveries reach the others within a second.
func TestCompetingConsumers(t *testing.T) {
	tb := startBroker(t, nil)
	const n = 10000
	ids := sendN(t, tb, "t", n, nil)

	var (
		mu        sync.Mutex
		holder    = map[string]int{} // message -> subscriber holding it
		acked     = map[string]int{}
		overlaps  int
		killedAt  time.Time
		orphans   = map[string]bool{}
		rescuedIn time.Duration
	)
	subs := make([]*subscription, 3)
	for i := range subs {
		subs[i] = subscribe(t, tb, "t", "g", 32)
	}
	// Subscriber 0 takes a few deliveries and never acks them, then dies.
	victim := subs[0]
	for len(orphans) < 32 {
		d := victim.next(5 * time.Second)
		require.NotNil(t, d)
		orphans[d.MessageId] = true
		holder[d.MessageId] = 0
	}

	var wg sync.WaitGroup
	for i := 1; i < 3; i++ {
		wg.Add(1)
		go func(i int, s *subscription) {
			defer wg.Done()
			for {
				d := s.next(3 * time.Second)
				if d == nil {
					return
				}
				mu.Lock()
				if h, ok := holder[d.MessageId]; ok && h != i && !orphans[d.MessageId] {
					overlaps++
				}
				if orphans[d.MessageId] {
					delete(orphans, d.MessageId)
					if len(orphans) == 0 {
						rescuedIn = time.Since(killedAt)
					}
				}
				holder[d.MessageId] = i
				acked[d.MessageId]++
				mu.Unlock()
				s.ack(d.MessageId)
			}
		}(i, subs[i])
	}
	txmqtest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(acked) < n/2 {
			return fmt.Errorf("%d acked", len(acked))
		}
		return nil
	})
	mu.Lock()
	killedAt = time.Now()
	mu.Unlock()
	victim.cancel()
	wg.Wait()

	require.Zero(t, overlaps, "a message was in flight at two subscribers at once")
	require.Empty(t, orphans, "the dead subscriber's deliveries were not redelivered")
	require.Less(t, rescuedIn, time.Second, "the dead subscriber's deliveries took too long to move")
	t.Logf("dead subscriber's 32 deliveries reached the others in %s", rescuedIn)
	require.Len(t, acked, n)
	for _, id := range ids {
		require.Equal(t, 1, acked[id], "message %s handled %d times by the live subscribers", id, acked[id])
	}
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if lag := describe(t, tb, "g").Topics[0].Lag; lag != 0 {
			return fmt.Errorf("lag %d", lag)
		}
		return nil
	})
}

// A handler that always fails: the message comes back on the backoff
// schedule (injected clock), goes to the DLQ after max_deliveries with the
// consumer's error, and redrive brings it back with its attempts reset.
func TestNackBackoffDeadLetterRedrive(t *testing.T) {
	clk := newClock()
	tb := startBroker(t, func(cfg *Config) { cfg.Now = clk.Now })
	ctx := ctxT(t)
	four := uint32(4)
	backoff := []time.Duration{time.Second, 5 * time.Second, 10 * time.Second}
	cfgReq := &txmqv1.ConsumerGroupConfig{ConsumerGroup: "g", MaxDeliveries: &four}
	for _, d := range backoff {
		cfgReq.RedeliveryBackoff = append(cfgReq.RedeliveryBackoff, durationpb.New(d))
	}
	_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: cfgReq})
	require.NoError(t, err)

	ids := sendN(t, tb, "t", 1, nil)
	sub := subscribe(t, tb, "t", "g", 0)
	for attempt := uint32(1); attempt <= 4; attempt++ {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d, "attempt %d", attempt)
		require.Equal(t, ids[0], d.MessageId)
		require.Equal(t, attempt, d.Attempt)
		if attempt > 1 {
			require.Equal(t, fmt.Sprintf("boom %d", attempt-1), d.LastError)
		}
		sub.nack(nil, fmt.Sprintf("boom %d", attempt), d.MessageId)
		if attempt == 4 {
			break
		}
		wait := backoff[attempt-1]
		// Just before the backoff is over: nothing. The failure of this
		// attempt must be recorded first (the clock it started its backoff
		// at is the one before the advance); Retrying is 1 from the first
		// failure on, so it is the count of failures that says so.
		txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
			if st := describe(t, tb, "g").Topics[0]; st.Retrying != 1 || st.Redeliveries != uint64(attempt) {
				return fmt.Errorf("failure %d not recorded yet (retrying %d, failures %d)", attempt, st.Retrying, st.Redeliveries)
			}
			return nil
		})
		clk.advance(tb.Broker, wait-10*time.Millisecond)
		require.Nil(t, sub.next(150*time.Millisecond), "redelivered before the backoff of %s", wait)
		clk.advance(tb.Broker, 10*time.Millisecond)
	}
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := describe(t, tb, "g").Topics[0].DeadLetters; n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})
	clk.advance(tb.Broker, time.Hour)
	require.Nil(t, sub.next(200*time.Millisecond), "a dead letter is not delivered")
	st := describe(t, tb, "g").Topics[0]
	require.Equal(t, uint64(0), st.Lag)
	require.Equal(t, uint64(4), st.Redeliveries)
	require.Equal(t, uint64(0), st.Retrying)

	dlq, err := tb.admin.ListDeadLetters(ctx, &txmqv1.ListDeadLettersRequest{ConsumerGroup: "g"})
	require.NoError(t, err)
	require.Len(t, dlq.DeadLetters, 1)
	require.Equal(t, ids[0], dlq.DeadLetters[0].MessageId)
	require.Equal(t, uint32(4), dlq.DeadLetters[0].Attempts)
	require.Equal(t, "boom 4", dlq.DeadLetters[0].LastError)
	require.Empty(t, dlq.DeadLetters[0].Body, "list leaves bodies out")
	one, err := tb.admin.GetDeadLetter(ctx, &txmqv1.GetDeadLetterRequest{ConsumerGroup: "g", MessageId: ids[0]})
	require.NoError(t, err)
	require.Equal(t, "0", string(one.DeadLetter.Body))

	rd, err := tb.admin.RedriveDeadLetters(ctx, &txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "g", MessageIds: ids})
	require.NoError(t, err)
	require.Equal(t, uint64(1), rd.Redriven)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d, "redrive brings the message back")
	require.Equal(t, ids[0], d.MessageId)
	require.Equal(t, uint32(1), d.Attempt, "redrive resets the attempts")
	require.Equal(t, "boom 4", d.LastError)
	sub.ack(d.MessageId)
	sub.waitConfirm(d.MessageId)
	st = describe(t, tb, "g").Topics[0]
	require.Zero(t, st.Lag)
	require.Zero(t, st.DeadLetters)
}

// Attempts are replicated: after a restart the next delivery continues the
// count instead of starting again at 1, and the backoff still holds.
func TestAttemptsSurviveRestart(t *testing.T) {
	c := newCluster(t, 1, nil)
	tb := c.Leader()
	ids := sendN(t, tb, "t", 1, nil)
	sub := subscribe(t, tb, "t", "g", 0)
	zero := time.Duration(0)
	for attempt := uint32(1); attempt <= 2; attempt++ {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		require.Equal(t, attempt, d.Attempt)
		sub.nack(&zero, "nope", d.MessageId)
	}
	require.NotNil(t, sub.next(5*time.Second), "the third delivery")
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if st := describe(t, tb, "g").Topics[0]; st.Redeliveries != 2 {
			return fmt.Errorf("%d redeliveries recorded", st.Redeliveries)
		}
		return nil
	})
	sub.cancel()

	c.Restart("n1")
	tb = c.Leader()
	sub = subscribe(t, tb, "t", "g", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, ids[0], d.MessageId)
	// The third delivery went to a subscriber that left without acking:
	// its failure is recorded unless the broker stopped first. Either way
	// the count goes on instead of starting again at 1.
	switch d.Attempt {
	case 3:
		require.Equal(t, "nope", d.LastError)
	case 4:
		require.Equal(t, "the subscriber went away before acking", d.LastError)
	default:
		t.Fatalf("attempt %d after a restart, want 3 or 4", d.Attempt)
	}
}

// 100 ordering keys x 100 messages, random handler failures: per key the
// group processes in commit order, with one message of a key in flight.
func TestOrderingKeys(t *testing.T) {
	tb := startBroker(t, nil)
	const keys, perKey = 100, 100
	key := func(i int) string { return fmt.Sprintf("k%03d", i%keys) }
	ids := sendN(t, tb, "t", keys*perKey, key)
	index := map[string]int{}
	for i, id := range ids {
		index[id] = i
	}

	var (
		mu        sync.Mutex
		processed = map[string][]int{} // key -> message indexes in processing order
		inFlight  = map[string]string{}
		violation error
		done      atomic.Int64
		failures  atomic.Int64
	)
	zero := time.Duration(0)
	var wg sync.WaitGroup
	for s := 0; s < 3; s++ {
		sub := subscribe(t, tb, "t", "g", 64)
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, seed))
			for done.Load() < keys*perKey {
				d := sub.next(200 * time.Millisecond)
				if d == nil {
					continue
				}
				i := index[d.MessageId]
				k := key(i)
				mu.Lock()
				if other, busy := inFlight[k]; busy && other != d.MessageId && violation == nil {
					violation = fmt.Errorf("key %s: %s delivered while %s in flight", k, d.MessageId, other)
				}
				inFlight[k] = d.MessageId
				if d.OrderingKey != k && violation == nil {
					violation = fmt.Errorf("delivery of %s carries ordering key %q, want %q", d.MessageId, d.OrderingKey, k)
				}
				fail := rng.IntN(10) == 0
				if !fail {
					processed[k] = append(processed[k], i)
				}
				delete(inFlight, k)
				mu.Unlock()
				if fail {
					failures.Add(1)
					sub.nack(&zero, "random failure", d.MessageId)
					continue
				}
				sub.ack(d.MessageId)
				done.Add(1)
			}
		}(uint64(s) + 1)
	}
	wg.Wait()
	require.NoError(t, violation)
	t.Logf("%d messages processed with %d random failures", done.Load(), failures.Load())
	require.Positive(t, failures.Load())
	for k := 0; k < keys; k++ {
		got := processed[key(k)]
		require.Len(t, got, perKey, "key %s", key(k))
		for j := 1; j < len(got); j++ {
			require.Less(t, got[j-1], got[j], "key %s processed out of commit order", key(k))
		}
	}
}

// A poisoned ordering key goes to the DLQ without blocking the others
// (skip); with hold, the rest of its key waits for the operator.
func TestOrderedPoison(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			tb := startBroker(t, nil)
			ctx := ctxT(t)
			two := uint32(2)
			c := &txmqv1.ConsumerGroupConfig{ConsumerGroup: "g", MaxDeliveries: &two,
				RedeliveryBackoff: []*durationpb.Duration{durationpb.New(0)}}
			if hold {
				c.OrderedPoison = txmqv1.OrderedPoison_ORDERED_POISON_HOLD
			}
			_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: c})
			require.NoError(t, err)
			// a1 is poison; a2 follows it; b1 is another key.
			var ids []string
			for _, m := range []struct{ key, body string }{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}} {
				r, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(m.body), OrderingKey: m.key})
				require.NoError(t, err)
				ids = append(ids, r.MessageId)
			}
			sub := subscribe(t, tb, "t", "g", 10)
			got := map[string]int{}
			for {
				d := sub.next(time.Second)
				if d == nil {
					break
				}
				got[string(d.Body)]++
				if string(d.Body) == "a1" {
					sub.nack(nil, "poison", d.MessageId)
					continue
				}
				sub.ack(d.MessageId)
			}
			require.Equal(t, 2, got["a1"], "a1 is tried max_deliveries times")
			require.Equal(t, 1, got["b1"], "another key is not blocked")
			st := describe(t, tb, "g").Topics[0]
			require.Equal(t, uint64(1), st.DeadLetters)
			if !hold {
				require.Equal(t, 1, got["a2"], "skip: the key goes on after its dead letter")
				return
			}
			require.Zero(t, got["a2"], "hold: the rest of the key waits")
			require.Equal(t, uint64(1), st.Lag)
			// Purging the dead letter lets the key go on.
			pr, err := tb.admin.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "g", MessageIds: ids[:1]})
			require.NoError(t, err)
			require.Equal(t, uint64(1), pr.Purged)
			d := sub.next(5 * time.Second)
			require.NotNil(t, d)
			require.Equal(t, "a2", string(d.Body))
		})
	}
}

// group describe tells the truth about a known backlog.
func TestDescribeGroupMatchesTruth(t *testing.T) {
	clk := newClock()
	tb := startBroker(t, func(cfg *Config) { cfg.Now = clk.Now })
	ctx := ctxT(t)
	one := uint32(1)
	_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: "g", MaxDeliveries: &one,
	}})
	require.NoError(t, err)
	// Nobody reads the first 10 for a minute.
	sendN(t, tb, "t", 10, nil)
	firstAt := clk.Now()
	clk.advance(tb.Broker, time.Minute)
	sendN(t, tb, "t", 90, nil)

	sub := subscribe(t, tb, "t", "g", 20)
	var got []*txmqv1.Delivery
	for len(got) < 20 {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		got = append(got, d)
	}
	// Ack 15 out of order, nack the first (max_deliveries 1: straight to
	// the DLQ), leave 4 of the first minute in flight.
	var ackIDs []string
	for _, d := range got[5:] {
		ackIDs = append(ackIDs, d.MessageId)
	}
	sub.ack(ackIDs...)
	sub.waitConfirm(ackIDs...)
	sub.nack(nil, "bad", got[0].MessageId)
	// The DLQ entry lands, and the freed slots fill up from the log.
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		st := describe(t, tb, "g").Topics[0]
		if st.DeadLetters != 1 || st.InFlight != 20 {
			return fmt.Errorf("%d dead letters, %d in flight", st.DeadLetters, st.InFlight)
		}
		return nil
	})
	clk.advance(tb.Broker, time.Second)

	st := describe(t, tb, "g").Topics[0]
	require.Equal(t, uint64(100), st.LastSequence)
	require.Equal(t, uint64(1), st.FirstSequence)
	require.Equal(t, uint64(1), st.AckedThrough, "the dead letter counts as done")
	require.Equal(t, uint64(15), st.AckedAbove)
	require.Equal(t, uint64(84), st.Lag, "100 - 15 acked - 1 dead-lettered")
	require.Equal(t, uint32(20), st.InFlight, "4 left in flight, and 16 more pushed into the free slots")
	require.Equal(t, uint32(1), st.Subscribers)
	require.Equal(t, uint64(1), st.DeadLetters)
	require.Equal(t, uint64(1), st.Redeliveries)
	require.Zero(t, st.Retrying)
	require.Zero(t, st.Dropped)
	require.True(t, firstAt.Equal(st.OldestUnackedAt.AsTime()), "oldest unacked is message 2, of the first minute")
	require.Equal(t, time.Minute+time.Second, st.LagAge.AsDuration())

	list, err := tb.admin.ListConsumerGroups(ctx, &txmqv1.ListConsumerGroupsRequest{})
	require.NoError(t, err)
	require.Len(t, list.Groups, 1)
	require.Equal(t, st.Lag, list.Groups[0].Topics[0].Lag)
	require.Equal(t, uint32(1), list.Groups[0].Config.GetMaxDeliveries())
}

func TestResetGroup(t *testing.T) {
	clk := newClock()
	tb := startBroker(t, func(cfg *Config) { cfg.Now = clk.Now })
	ctx := ctxT(t)
	sendN(t, tb, "t", 10, nil)
	clk.advance(tb.Broker, time.Hour)
	mid := clk.Now()
	sendN(t, tb, "t", 10, nil)

	sub := subscribe(t, tb, "t", "g", 100)
	var ids []string
	for len(ids) < 20 {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		ids = append(ids, d.MessageId)
	}
	sub.ack(ids...)
	sub.waitConfirm(ids...)
	require.Zero(t, describe(t, tb, "g").Topics[0].Lag)

	dry, err := tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "g",
		To: txmqv1.StartPosition_START_POSITION_TIMESTAMP, Time: timestamppb.New(mid), DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Equal(t, []*txmqv1.GroupReset{{Topic: "t", OldAckedThrough: 20, NewAckedThrough: 10, LagBefore: 0, LagAfter: 10}}, dry.Topics)
	require.Zero(t, describe(t, tb, "g").Topics[0].Lag, "a dry run changes nothing")

	_, err = tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "g",
		To: txmqv1.StartPosition_START_POSITION_TIMESTAMP, Time: timestamppb.New(mid)})
	require.NoError(t, err)
	// The subscriber is sent away and subscribes again at the new position.
	require.Equal(t, codes.Unavailable, codeOf(sub.waitEnd(5*time.Second)))
	sub = subscribe(t, tb, "t", "g", 100)
	for i := 10; i < 20; i++ {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		require.Equal(t, ids[i], d.MessageId)
	}

	_, err = tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "g", To: txmqv1.StartPosition_START_POSITION_LATEST})
	require.NoError(t, err)
	st := describe(t, tb, "g").Topics[0]
	require.Equal(t, uint64(20), st.AckedThrough)
	require.Zero(t, st.Lag)
}

// A group created at a timestamp starts with the first message committed
// at or after it.
func TestStartAtTimestamp(t *testing.T) {
	clk := newClock()
	tb := startBroker(t, func(cfg *Config) { cfg.Now = clk.Now })
	sendN(t, tb, "t", 3, nil)
	clk.advance(tb.Broker, time.Minute)
	at := clk.Now()
	recent := sendN(t, tb, "t", 2, nil)
	stream, err := tb.consumer.Subscribe(ctxT(t))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
		Topic: "t", ConsumerGroup: "g", StartPosition: txmqv1.StartPosition_START_POSITION_TIMESTAMP, StartTime: timestamppb.New(at),
	}}}))
	first, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, uint64(3), first.GetSubscribed().AckedThrough)
	var got []string
	for range recent {
		m, err := stream.Recv()
		require.NoError(t, err)
		got = append(got, m.GetDelivery().GetMessageId())
	}
	require.ElementsMatch(t, recent, got)
}

func TestConsumerGroupBadInput(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	sendN(t, tb, "t", 1, nil)
	big := uint32(5000)
	zero := uint32(0)
	for name, c := range map[string]*txmqv1.ConsumerGroupConfig{
		"no group":             {},
		"max_deliveries 0":     {ConsumerGroup: "g", MaxDeliveries: &zero},
		"max_deliveries 5000":  {ConsumerGroup: "g", MaxDeliveries: &big},
		"ack deadline 10ms":    {ConsumerGroup: "g", AckDeadline: durationpb.New(10 * time.Millisecond)},
		"negative backoff":     {ConsumerGroup: "g", RedeliveryBackoff: []*durationpb.Duration{durationpb.New(-time.Second)}},
		"backoff over 12h":     {ConsumerGroup: "g", RedeliveryBackoff: []*durationpb.Duration{durationpb.New(13 * time.Hour)}},
		"unknown poison value": {ConsumerGroup: "g", OrderedPoison: 7},
	} {
		_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: c})
		require.Equal(t, codes.InvalidArgument, codeOf(err), name)
	}
	got, err := tb.admin.GetConsumerGroupConfig(ctx, &txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "g"})
	require.NoError(t, err)
	require.Equal(t, uint32(DefaultMaxDeliveries), got.Config.GetMaxDeliveries(), "refused changes change nothing")
	require.Len(t, got.Config.RedeliveryBackoff, len(DefaultRedeliveryBackoff()))

	sub := subscribe(t, tb, "t", "g", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	_, err = tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "g"})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "reset without a target")
	_, err = tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "g", To: txmqv1.StartPosition_START_POSITION_TIMESTAMP})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "TIMESTAMP without a time")
	for _, at := range []time.Time{time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)} {
		_, err = tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "g",
			To: txmqv1.StartPosition_START_POSITION_TIMESTAMP, Time: timestamppb.New(at)})
		require.Equal(t, codes.InvalidArgument, codeOf(err), "reset to %s", at)
		require.Contains(t, err.Error(), "outside 1970..2262")
		stream, err := tb.consumer.Subscribe(ctx)
		require.NoError(t, err)
		require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
			Topic: "t", ConsumerGroup: "new", StartPosition: txmqv1.StartPosition_START_POSITION_TIMESTAMP, StartTime: timestamppb.New(at)}}}))
		_, err = stream.Recv()
		require.Equal(t, codes.InvalidArgument, codeOf(err), "subscribe at %s", at)
	}
	_, err = tb.admin.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "nobody", To: txmqv1.StartPosition_START_POSITION_LATEST})
	require.Equal(t, codes.NotFound, codeOf(err))
	_, err = tb.admin.RedriveDeadLetters(ctx, &txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "g", MessageIds: []string{"x"}, All: true})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "IDs and all together")
	_, err = tb.admin.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "g"})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "neither IDs nor all")
	_, err = tb.admin.RedriveDeadLetters(ctx, &txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "g", MessageIds: []string{d.MessageId}})
	require.Equal(t, codes.NotFound, codeOf(err), "a message that is not a dead letter")
	_, err = tb.admin.GetDeadLetter(ctx, &txmqv1.GetDeadLetterRequest{ConsumerGroup: "g", MessageId: d.MessageId})
	require.Equal(t, codes.NotFound, codeOf(err))
	_, err = tb.admin.ListDeadLetters(ctx, &txmqv1.ListDeadLettersRequest{ConsumerGroup: "g", PageToken: "garbage"})
	require.Equal(t, codes.InvalidArgument, codeOf(err))
	_, err = tb.admin.ListDeadLetters(ctx, &txmqv1.ListDeadLettersRequest{ConsumerGroup: "g", Limit: 5000})
	require.Equal(t, codes.InvalidArgument, codeOf(err))

	// A nack delay out of range ends the stream with InvalidArgument; the
	// message is not lost: the next subscriber gets it.
	require.NoError(t, sub.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: &txmqv1.NackRequest{
		MessageIds: []string{d.MessageId}, Delay: durationpb.New(24 * time.Hour)}}}))
	require.Equal(t, codes.InvalidArgument, codeOf(sub.waitEnd(5*time.Second)))
	again := subscribe(t, tb, "t", "g", 0)
	d2 := again.next(5 * time.Second)
	require.NotNil(t, d2)
	require.Equal(t, d.MessageId, d2.MessageId)

	_, err = tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x"), OrderingKey: string(make([]byte, 2000))})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "ordering key too long")
}

// Deadline extension keeps a slow handler's message from being redelivered.
func TestExtendDeadline(t *testing.T) {
	clk := newClock()
	tb := startBroker(t, func(cfg *Config) { cfg.Now = clk.Now })
	sendN(t, tb, "t", 1, nil)
	sub := subscribe(t, tb, "t", "g", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, clk.Now().Add(DefaultAckDeadline), d.AckDeadline.AsTime().In(clk.Now().Location()))
	deadline := func() time.Time {
		tb.mu.Lock()
		disp := tb.dispatchers[groupKey{"t", "g"}]
		tb.mu.Unlock()
		disp.mu.Lock()
		defer disp.mu.Unlock()
		if e := disp.q.get(d.MessageId); e != nil && e.state == stInFlight {
			return e.deadline
		}
		return time.Time{}
	}
	for i := 0; i < 3; i++ {
		clk.advance(tb.Broker, 20*time.Second)
		require.NoError(t, sub.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Extend{Extend: &txmqv1.ExtendRequest{
			MessageIds: []string{d.MessageId}, Extension: durationpb.New(30 * time.Second)}}}))
		want := clk.Now().Add(30 * time.Second)
		txmqtest.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
			if got := deadline(); !got.Equal(want) {
				return fmt.Errorf("deadline %s, want %s", got, want)
			}
			return nil
		})
	}
	clk.advance(tb.Broker, 25*time.Second)
	require.Nil(t, sub.next(200*time.Millisecond), "redelivered although extended: 85 s after delivery, 30 s deadline")
	clk.advance(tb.Broker, 10*time.Second)
	// The deadline is missed: the failure is recorded, and the message
	// comes back after the first backoff step.
	txmqtest.CheckFor(t, 5*time.Second, time.Millisecond, func() error {
		if n := describe(t, tb, "g").Topics[0].Retrying; n != 1 {
			return fmt.Errorf("%d retrying", n)
		}
		return nil
	})
	clk.advance(tb.Broker, time.Second)
	again := sub.next(5 * time.Second)
	require.NotNil(t, again, "once the extension runs out, the message comes back")
	require.Equal(t, uint32(2), again.Attempt)
}

// A client that closes its side of the stream hands its deliveries back at
// once without a failed attempt; a stream that breaks counts one.
func TestClosedStreamHandsBackWithoutFailure(t *testing.T) {
	tb := startBroker(t, nil)
	ids := sendN(t, tb, "t", 1, nil)
	a := subscribe(t, tb, "t", "g", 0)
	require.NotNil(t, a.next(5*time.Second))
	b := subscribe(t, tb, "t", "g", 0)
	require.NoError(t, a.stream.CloseSend())
	d := b.next(5 * time.Second)
	require.NotNil(t, d, "handed back at once")
	require.Equal(t, ids[0], d.MessageId)
	require.Equal(t, uint32(2), d.Attempt)
	require.Empty(t, d.LastError)
	require.Zero(t, describe(t, tb, "g").Topics[0].Redeliveries)

	b.cancel()
	c := subscribe(t, tb, "t", "g", 0)
	d = c.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, uint32(3), d.Attempt)
	require.Equal(t, "the subscriber went away before acking", d.LastError)
	require.Equal(t, uint64(1), describe(t, tb, "g").Topics[0].Redeliveries)
}

// With hold, a redriven poison message goes before the rest of its key.
func TestHeldKeyRedriveKeepsOrder(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	one := uint32(1)
	_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: "g", MaxDeliveries: &one, OrderedPoison: txmqv1.OrderedPoison_ORDERED_POISON_HOLD,
	}})
	require.NoError(t, err)
	for _, body := range []string{"a1", "a2", "a3"} {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(body), OrderingKey: "a"})
		require.NoError(t, err)
	}
	sub := subscribe(t, tb, "t", "g", 10)
	d := sub.next(5 * time.Second)
	require.Equal(t, "a1", string(d.Body))
	sub.nack(nil, "poison", d.MessageId)
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := describe(t, tb, "g").Topics[0].DeadLetters; n != 1 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})
	require.Nil(t, sub.next(200*time.Millisecond), "the key is held")
	_, err = tb.admin.RedriveDeadLetters(ctx, &txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "g", All: true})
	require.NoError(t, err)
	for _, want := range []string{"a1", "a2", "a3"} {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d, "waiting for %s", want)
		require.Equal(t, want, string(d.Body), "commit order after the redrive")
		// No waiting for the confirmation: the next delivery of the key
		// may come before it, and waitConfirm would skip it.
		sub.ack(d.MessageId)
	}
}

// An ack the consumer sent that could not be replicated (a leader in a
// leadership transfer refuses writes) is no failed delivery: when the
// stream then ends, the message comes again with no failure recorded, so
// that such churn never dead-letters a message the consumer processed.
func TestUnreplicatedAckIsNoFailure(t *testing.T) {
	c := newCluster(t, 1, nil)
	tb := c.Leader()
	ids := sendN(t, tb, "t", 1, nil)
	sub := subscribe(t, tb, "t", "g", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	tb.mu.Lock()
	disp := tb.dispatchers[groupKey{"t", "g"}]
	tb.mu.Unlock()
	refused, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := disp.ack(refused, ids)
	require.Error(t, err, "the ack's proposal is refused")
	sub.cancel()

	sub = subscribe(t, tb, "t", "g", 0)
	d = sub.next(5 * time.Second)
	require.NotNil(t, d, "delivered again")
	require.Equal(t, ids[0], d.MessageId)
	require.Equal(t, uint32(2), d.Attempt)
	require.Empty(t, d.LastError, "no failure recorded")
	require.Zero(t, describe(t, tb, "g").Topics[0].Redeliveries)
	sub.ack(d.MessageId)
	sub.waitConfirm(d.MessageId)
}
