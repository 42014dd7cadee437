package clienttest

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// listener answers by body: "commit…" commits, "rollback…" rolls back,
// "unknown…" is UNKNOWN when executed and COMMIT when checked.
type listener struct {
	mu     sync.Mutex
	checks map[string]int
}

func (l *listener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	switch b := string(m.Body); {
	case len(b) >= 6 && b[:6] == "commit":
		return primitive.CommitMessageState
	case len(b) >= 8 && b[:8] == "rollback":
		return primitive.RollbackMessageState
	}
	return primitive.UnkonwnState
}

func (l *listener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	l.mu.Lock()
	l.checks[string(m.Body)]++
	l.mu.Unlock()
	return primitive.CommitMessageState
}

func (l *listener) checked(body string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checks[body]
}

func TestTransactionProducer(t *testing.T) {
	e := newEnv(t)
	topic, group := e.name("orders"), e.name("tx-producer")
	l := &listener{checks: map[string]int{}}
	p, err := producer.NewTransactionProducer(l, e.producerOpts(group)...)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { p.Shutdown() })

	txIDs := map[string]string{}
	for _, body := range []string{"commit-1", "rollback-1", "unknown-1", "commit-2"} {
		r, err := p.SendMessageInTransaction(context.Background(), primitive.NewMessage(topic, []byte(body)))
		require.NoError(t, err)
		require.Equal(t, primitive.SendOK, r.Status)
		require.NotEmpty(t, r.TransactionID)
		txIDs[body] = r.TransactionID
	}

	got := newReceived()
	e.consumer(e.name("tx-consumer"), "c1", topic, got, nil)
	e.waitFor(got, "commit-1", "commit-2", "unknown-1")
	require.Equal(t, 1, l.checked("unknown-1"), "the UNKNOWN one was checked back over the producer's connection")
	txmqtest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		st := e.halfStates(group)
		want := map[string]txmqv1.HalfState{
			txIDs["commit-1"]: txmqv1.HalfState_HALF_STATE_COMMITTED, txIDs["commit-2"]: txmqv1.HalfState_HALF_STATE_COMMITTED,
			txIDs["unknown-1"]: txmqv1.HalfState_HALF_STATE_COMMITTED, txIDs["rollback-1"]: txmqv1.HalfState_HALF_STATE_ROLLED_BACK,
		}
		for id, s := range want {
			if st[id] != s {
				return fmt.Errorf("half %s is %s, want %s", id, st[id], s)
			}
		}
		return nil
	})
	// Nothing more comes: every committed message once, the rolled-back never.
	time.Sleep(time.Second) // a quiet period, to see that nothing else arrives
	require.Equal(t, map[string]int{"commit-1": 1, "commit-2": 1, "unknown-1": 1}, got.snapshot())
}

// A producer that dies after its half message: while it is away no check
// is used up; a new instance of the group answers the check from its own
// records and the message commits.
func TestCheckBackReachesARestartedProducer(t *testing.T) {
	e := newEnv(t)
	topic, group := e.name("payments"), e.name("pay-producer")
	l1 := &listener{checks: map[string]int{}}
	p1, err := producer.NewTransactionProducer(l1, append(e.producerOpts(group), producer.WithInstanceName("first"))...)
	require.NoError(t, err)
	require.NoError(t, p1.Start())
	r, err := p1.SendMessageInTransaction(context.Background(), primitive.NewMessage(topic, []byte("unknown-pay")))
	require.NoError(t, err)
	require.Equal(t, primitive.UnkonwnState, r.State)
	require.NoError(t, p1.Shutdown())

	// The "restarted" producer answers from its records (a map).
	committed := map[string]bool{"unknown-pay": true}
	l2 := &mapListener{committed: committed}
	p2, err := producer.NewTransactionProducer(l2, append(e.producerOpts(group), producer.WithInstanceName("second"))...)
	require.NoError(t, err)
	require.NoError(t, p2.Start())
	t.Cleanup(func() { p2.Shutdown() })
	// The group registers with the broker on the producer's first
	// heartbeat or send; a send on another topic makes it now.
	_, err = p2.SendMessageInTransaction(context.Background(), primitive.NewMessage(e.name("other"), []byte("rollback-x")))
	require.NoError(t, err)

	got := newReceived()
	e.consumer(e.name("pay-consumer"), "c1", topic, got, nil)
	e.waitFor(got, "unknown-pay")
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, e.halfStates(group)[r.TransactionID])
}

type mapListener struct{ committed map[string]bool }

func (l *mapListener) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	return primitive.RollbackMessageState
}

func (l *mapListener) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	if l.committed[string(m.Body)] {
		return primitive.CommitMessageState
	}
	return primitive.RollbackMessageState
}

func TestSendKinds(t *testing.T) {
	e := newEnv(t)
	topic := e.name("events")
	p := e.producer(e.name("plain"))
	ctx := context.Background()

	r, err := p.SendSync(ctx, primitive.NewMessage(topic, []byte("sync")))
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, r.Status)
	require.Len(t, r.OffsetMsgID, 32)
	require.NoError(t, p.SendOneWay(ctx, primitive.NewMessage(topic, []byte("oneway"))))
	done := make(chan error, 1)
	require.NoError(t, p.SendAsync(ctx, func(_ context.Context, r *primitive.SendResult, err error) { done <- err },
		primitive.NewMessage(topic, []byte("async"))))
	require.NoError(t, <-done)
	r, err = p.SendSync(ctx, primitive.NewMessage(topic, []byte("batch-1")), primitive.NewMessage(topic, []byte("batch-2")),
		primitive.NewMessage(topic, []byte("batch-3")))
	require.NoError(t, err)
	require.Equal(t, primitive.SendOK, r.Status)
	// A tagged message, and a body large enough for the client to compress.
	big := make([]byte, 8<<10)
	for i := range big {
		big[i] = 'x'
	}
	_, err = p.SendSync(ctx, primitive.NewMessage(topic, big).WithTag("big"))
	require.NoError(t, err)

	got := newReceived()
	e.consumer(e.name("all"), "c1", topic, got, nil)
	e.waitFor(got, "sync", "oneway", "async", "batch-1", "batch-2", "batch-3", string(big))

	tagged := newReceived()
	tc, err := consumer.NewPushConsumer(consumer.WithNameServer(e.names), consumer.WithGroupName(e.name("tagged")),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset))
	require.NoError(t, err)
	require.NoError(t, tc.Subscribe(topic, consumer.MessageSelector{Type: consumer.TAG, Expression: "big"},
		func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
			tagged.add("t", msgs)
			return consumer.ConsumeSuccess, nil
		}))
	require.NoError(t, tc.Start())
	t.Cleanup(func() { tc.Shutdown() })
	e.waitFor(tagged, string(big))
	require.Len(t, tagged.snapshot(), 1, "the tag filter takes only the tagged message")
}

// Two instances of a clustering group share the topic's queues: each
// message reaches the group once, and both instances get some.
func TestClusteringShares(t *testing.T) {
	e := newEnv(t)
	topic, group := e.name("work"), e.name("workers")
	p := e.producer(e.name("work-producer"))
	got := newReceived()
	e.consumer(group, "w1", topic, got, nil)
	e.consumer(group, "w2", topic, got, nil)
	var bodies []string
	for i := range 40 {
		b := fmt.Sprint("job-", i)
		bodies = append(bodies, b)
		_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(b)))
		require.NoError(t, err)
	}
	e.waitFor(got, bodies...)
	txmqtest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		got.mu.Lock()
		defer got.mu.Unlock()
		if len(got.by["w1"]) == 0 || len(got.by["w2"]) == 0 {
			return fmt.Errorf("one worker got nothing: w1 %d, w2 %d", len(got.by["w1"]), len(got.by["w2"]))
		}
		return nil
	})
}

// Committed offsets survive the consumer: a new instance of the group
// starts after what the first one consumed.
func TestOffsetsSurviveTheConsumer(t *testing.T) {
	e := newEnv(t)
	topic, group := e.name("ledger"), e.name("ledger-readers")
	p := e.producer(e.name("ledger-producer"))
	for i := range 8 {
		_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(fmt.Sprint("first-", i))))
		require.NoError(t, err)
	}
	got := newReceived()
	stop := e.consumer(group, "r1", topic, got, nil)
	var first []string
	for i := range 8 {
		first = append(first, fmt.Sprint("first-", i))
	}
	e.waitFor(got, first...)
	// The client commits a message's offset after its callback returned,
	// every 5 s and on shutdown: stopped at once, it may not have recorded
	// the last ones yet, and they would rightly come again. So the group's
	// acks must cover all eight first.
	txmqtest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		d, err := e.admin.DescribeConsumerGroup(context.Background(), &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: group})
		if err != nil {
			return err
		}
		for _, tp := range d.GetTopics() {
			if tp.GetTopic() == topic && tp.GetLastSequence() == 8 && tp.GetLag() == 0 {
				return nil
			}
		}
		return fmt.Errorf("the group has not committed all eight offsets yet: %v", d.GetTopics())
	})
	stop()
	for i := range 4 {
		_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(fmt.Sprint("second-", i))))
		require.NoError(t, err)
	}
	again := newReceived()
	e.consumer(group, "r2", topic, again, nil)
	e.waitFor(again, "second-0", "second-1", "second-2", "second-3")
	for b := range again.snapshot() {
		require.NotContains(t, b, "first-", "a committed message came again")
	}
}

// A consumer that answers RECONSUME_LATER sees the message again after
// its delay level, with its reconsume count; one that never takes it sees
// it maxReconsumeTimes+1 times, then it is in txmq's dead-letter queue of
// the group.
func TestRetryLaterAndDeadLetter(t *testing.T) {
	e := newEnv(t)
	topic, group := e.name("mail"), e.name("mailers")
	p := e.producer(e.name("mail-producer"))
	for _, b := range []string{"flaky", "poison", "fine"} {
		_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(b)))
		require.NoError(t, err)
	}
	var mu sync.Mutex
	seen := map[string][]int32{}
	var flakyAt []time.Time
	c, err := consumer.NewPushConsumer(
		consumer.WithNameServer(e.names), consumer.WithGroupName(group),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset), consumer.WithMaxReconsumeTimes(2),
		consumer.WithConsumeMessageBatchMaxSize(1))
	require.NoError(t, err)
	require.NoError(t, c.Subscribe(topic, consumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		mu.Lock()
		defer mu.Unlock()
		m := msgs[0]
		b := string(m.Body)
		seen[b] = append(seen[b], m.ReconsumeTimes)
		if b == "flaky" {
			flakyAt = append(flakyAt, time.Now())
		}
		if b == "fine" || b == "flaky" && len(seen[b]) == 3 {
			return consumer.ConsumeSuccess, nil
		}
		cc, _ := primitive.GetConcurrentlyCtx(ctx)
		cc.DelayLevelWhenNextConsume = 1 // 1 s
		return consumer.ConsumeRetryLater, nil
	}))
	require.NoError(t, c.Start())
	t.Cleanup(func() { c.Shutdown() })

	txmqtest.CheckFor(t, 60*time.Second, 100*time.Millisecond, func() error {
		r, err := e.admin.ListDeadLetters(context.Background(), &txmqv1.ListDeadLettersRequest{ConsumerGroup: group})
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if len(seen["flaky"]) < 3 || len(r.GetDeadLetters()) == 0 {
			return fmt.Errorf("seen %v, dead letters %d", seen, len(r.GetDeadLetters()))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int32{0, 1, 2}, seen["flaky"], "redelivered with its reconsume count")
	require.GreaterOrEqual(t, flakyAt[1].Sub(flakyAt[0]), 900*time.Millisecond, "redelivered after its delay level (1 s)")
	require.Equal(t, []int32{0, 1, 2}, seen["poison"], "delivered maxReconsumeTimes+1 times")
	require.Equal(t, []int32{0}, seen["fine"])
	r, err := e.admin.ListDeadLetters(context.Background(), &txmqv1.ListDeadLettersRequest{ConsumerGroup: group})
	require.NoError(t, err)
	require.Len(t, r.GetDeadLetters(), 1)
	require.Equal(t, uint32(3), r.GetDeadLetters()[0].GetAttempts())
}

// ConsumeFromTimestamp starts at the first message committed at or after
// the timestamp (RocketMQ's format, seconds, UTC).
func TestConsumeFromTimestamp(t *testing.T) {
	e := newEnv(t)
	topic := e.name("audit")
	p := e.producer(e.name("audit-producer"))
	for i := range 4 {
		_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(fmt.Sprint("old-", i))))
		require.NoError(t, err)
	}
	sent := time.Now()
	// The next whole second, on the broker's clock (the machine's here).
	txmqtest.CheckFor(t, 3*time.Second, 10*time.Millisecond, func() error {
		if time.Now().Truncate(time.Second).After(sent) {
			return nil
		}
		return fmt.Errorf("still the second of the old messages")
	})
	from := time.Now().Truncate(time.Second)
	for i := range 4 {
		_, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(fmt.Sprint("new-", i))))
		require.NoError(t, err)
	}
	got := newReceived()
	e.consumer(e.name("auditors"), "a1", topic, got, nil,
		consumer.WithConsumeFromWhere(consumer.ConsumeFromTimestamp),
		consumer.WithConsumeTimestamp(from.UTC().Format("20060102150405")))
	e.waitFor(got, "new-0", "new-1", "new-2", "new-3")
	for b := range got.snapshot() {
		require.NotContains(t, b, "old-", "a message from before the timestamp")
	}
}
