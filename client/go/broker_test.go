package txmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// These tests run the client against real brokers, started through the
// harness (txmqtest).

// brokers is a harness cluster of real brokers.
type brokers = txmqtest.Cluster[*broker.Broker]

// newBrokers starts n brokers, configured by configure when set.
func newBrokers(t *testing.T, n int, configure func(*broker.Config), opts ...txmqtest.Option) *brokers {
	return txmqtest.NewCluster(t, n, func(s txmqtest.Spec) (*broker.Broker, error) {
		cfg := broker.Config{Raft: s.Raft, GRPCListener: s.API, Join: s.Join, Logger: txmqtest.Logger()}
		if configure != nil {
			configure(&cfg)
		}
		return broker.Open(cfg)
	}, opts...)
}

// realBroker is a single-node broker, at the same address across restarts.
type realBroker struct {
	t        *testing.T
	c        *brokers
	grpcAddr string
}

func newRealBroker(t *testing.T) *realBroker {
	c := newBrokers(t, 1, func(cfg *broker.Config) {
		// Short heartbeats so that producers find a restarted leader fast.
		cfg.CheckBack = checkback.Config{HeartbeatInterval: 100 * time.Millisecond, Lease: time.Second}
	})
	return &realBroker{t: t, c: c, grpcAddr: c.Leader().Addr()}
}

func (rb *realBroker) restart() {
	rb.t.Helper()
	rb.c.Restart("n1")
	rb.c.Leader()
}

func (rb *realBroker) halfState(id string) txmqv1.HalfState {
	rb.t.Helper()
	conn, err := grpc.NewClient(rb.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(rb.t, err)
	defer conn.Close()
	r, err := txmqv1.NewAdminServiceClient(conn).GetHalfMessage(context.Background(), &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(rb.t, err)
	return r.Message.State
}

// inState is a condition for CheckFor: the half message id is in state
// want.
func (rb *realBroker) inState(id string, want txmqv1.HalfState) func() error {
	return func() error {
		if st := rb.halfState(id); st != want {
			return fmt.Errorf("half message %s is %s, not %s", id, st, want)
		}
		return nil
	}
}

// received collects what a consumer's handler saw.
type received struct {
	mu   sync.Mutex
	msgs []*txmq.Delivery
}

func (r *received) handler(ctx context.Context, d *txmq.Delivery) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, d)
	return nil
}

func (r *received) bodies() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, m := range r.msgs {
		out = append(out, string(m.Body))
	}
	return out
}

// atLeast is a condition for CheckFor: n messages or more were received.
func (r *received) atLeast(n int) func() error {
	return func() error {
		if b := r.bodies(); len(b) < n {
			return fmt.Errorf("received %q, waiting for %d messages", b, n)
		}
		return nil
	}
}

func runConsumer(t *testing.T, addr, topic, group string, h txmq.Handler) {
	t.Helper()
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{addr}, Topic: topic, Group: group})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, h) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		c.Close()
	})
}

func TestBrokerSendInTransaction(t *testing.T) {
	rb := newRealBroker(t)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop"})
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var got received
	runConsumer(t, rb.grpcAddr, "orders", "points", got.handler)

	ran := false
	okID, err := p.SendInTransaction(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")},
		func(ctx context.Context) error { ran = true; return nil })
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, rb.halfState(okID))

	localErr := errors.New("insufficient balance")
	badID, err := p.SendInTransaction(ctx, "order-2:paid", txmq.Message{Topic: "orders", Body: []byte("failed")},
		func(ctx context.Context) error { return localErr })
	require.ErrorIs(t, err, localErr)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_ROLLED_BACK, rb.halfState(badID))

	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, got.atLeast(1))
	require.Equal(t, []string{"paid"}, got.bodies())

	// The rolled-back transaction ID cannot be committed later.
	err = p.CommitTx(ctx, "order-2:paid")
	require.ErrorIs(t, err, txmq.ErrConflict)
	require.ErrorContains(t, err, "ROLLED_BACK")
}

func TestBrokerConsumerSurvivesRestart(t *testing.T) {
	rb := newRealBroker(t)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}})
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var got received
	runConsumer(t, rb.grpcAddr, "t", "g", got.handler)
	_, err = p.Send(ctx, txmq.Message{Topic: "t", Body: []byte("before")})
	require.NoError(t, err)
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, got.atLeast(1))
	// Restart once the ack is durable: an ack still on its way when the
	// broker stops is lost, and the message comes again (at least once).
	admin := rb.admin(t)
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		d, err := admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "g"})
		if err != nil {
			return err
		}
		if len(d.Topics) != 1 || d.Topics[0].AckedThrough != 1 {
			return fmt.Errorf("group g: %v", d.Topics)
		}
		return nil
	})

	rb.restart()
	_, err = p.Send(ctx, txmq.Message{Topic: "t", Body: []byte("after")})
	require.NoError(t, err)
	txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, got.atLeast(2))
	require.Equal(t, []string{"before", "after"}, got.bodies())
}

func TestBrokerLargestMessage(t *testing.T) {
	rb := newRealBroker(t)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}})
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := make([]byte, broker.DefaultMaxMessage)
	_, err = p.Send(ctx, txmq.Message{Topic: "big", Body: body})
	require.NoError(t, err)
	_, err = p.Send(ctx, txmq.Message{Topic: "big", Body: append(body, 0)})
	require.ErrorIs(t, err, txmq.ErrInvalidArgument)

	var got received
	runConsumer(t, rb.grpcAddr, "big", "g", got.handler)
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, got.atLeast(1))
	require.Len(t, got.bodies()[0], broker.DefaultMaxMessage)
}

// txLog stands in for the producer's transaction-log table: the local
// transaction writes its outcome there, and the checker reads only there.
type txLog struct {
	mu        sync.Mutex
	committed map[string]bool
}

func (l *txLog) commit(tx string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.committed[tx] = true
}

func (l *txLog) checker(ctx context.Context, m txmq.HalfMessage) (txmq.Resolution, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.committed[m.TransactionID] {
		return txmq.Commit, nil
	}
	return txmq.Rollback, nil
}

// A producer dies after its local transaction, before Commit; another dies
// after its local transaction failed. A live instance of the group answers
// the check-backs: the first message is committed and delivered, the second
// rolled back and never delivered.
func TestBrokerCheckBackResolvesOrphans(t *testing.T) {
	rb := newRealBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := &txLog{committed: map[string]bool{}}

	crashed, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop"})
	require.NoError(t, err)
	paid, err := crashed.SendHalf(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")}, txmq.WithCheckAfter(time.Second))
	require.NoError(t, err)
	db.commit("order-1:paid")
	failed, err := crashed.SendHalf(ctx, "order-2:paid", txmq.Message{Topic: "orders", Body: []byte("failed")}, txmq.WithCheckAfter(time.Second))
	require.NoError(t, err)
	require.NoError(t, crashed.Close())
	sent := time.Now()

	var got received
	runConsumer(t, rb.grpcAddr, "orders", "points", got.handler)

	live, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop", Checker: db.checker})
	require.NoError(t, err)
	defer live.Close()

	txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, got.atLeast(1))
	t.Logf("orphan committed by check-back and delivered %s after it was sent (check_after 1s)", time.Since(sent).Round(time.Millisecond))
	require.Equal(t, []string{"paid"}, got.bodies())
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, rb.halfState(paid))
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, rb.inState(failed, txmqv1.HalfState_HALF_STATE_ROLLED_BACK))
	require.Equal(t, []string{"paid"}, got.bodies(), "the rolled-back message is never delivered")
}

// The broker restarts (a leader change on one node) while a half message
// waits for its check: the producer registers again and the check happens.
func TestBrokerCheckBackResumesAfterRestart(t *testing.T) {
	rb := newRealBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := &txLog{committed: map[string]bool{}}
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop", Checker: db.checker})
	require.NoError(t, err)
	defer p.Close()
	id, err := p.SendHalf(ctx, "order-9:paid", txmq.Message{Topic: "orders", Body: []byte("x")}, txmq.WithCheckAfter(time.Second))
	require.NoError(t, err)
	db.commit("order-9:paid")

	rb.restart()
	txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, rb.inState(id, txmqv1.HalfState_HALF_STATE_COMMITTED))
}

// A producer and a consumer given only a follower's address follow the
// leader named in the follower's refusal.
func TestBrokerClusterClientsOnAFollower(t *testing.T) {
	c := newBrokers(t, 3, nil)
	follower := c.Follower()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{follower.Addr()}, ProducerGroup: "shop"})
	require.NoError(t, err)
	defer p.Close()
	var got received
	runConsumer(t, follower.Addr(), "orders", "points", got.handler)
	_, err = p.SendInTransaction(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")},
		func(ctx context.Context) error { return nil })
	require.NoError(t, err)
	txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, got.atLeast(1))
	c.VerifyStores()
}

func (rb *realBroker) admin(t *testing.T) txmqv1.AdminServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(rb.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return txmqv1.NewAdminServiceClient(conn)
}

// A handler error nacks: the message comes back with the next attempt and
// the error as LastError; RetryAfter's delay is honoured; a slow handler
// keeps its delivery by the consumer's automatic extension.
func TestBrokerNackRetryAndExtension(t *testing.T) {
	rb := newRealBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	oneSecond := durationpb.New(time.Second)
	_, err := rb.admin(t).SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: "g", AckDeadline: oneSecond, RedeliveryBackoff: []*durationpb.Duration{durationpb.New(0)},
	}})
	require.NoError(t, err)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(ctx, txmq.Message{Topic: "t", Body: []byte("flaky"), OrderingKey: "k"})
	require.NoError(t, err)
	_, err = p.Send(ctx, txmq.Message{Topic: "t", Body: []byte("slow"), OrderingKey: "k"})
	require.NoError(t, err)

	var mu sync.Mutex
	var seen []string
	var retried time.Time
	runConsumer(t, rb.grpcAddr, "t", "g", func(ctx context.Context, d *txmq.Delivery) error {
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%s#%d %s", d.Body, d.Attempt, d.LastError))
		mu.Unlock()
		switch {
		case string(d.Body) == "flaky" && d.Attempt == 1:
			return errors.New("db down")
		case string(d.Body) == "flaky" && d.Attempt == 2:
			retried = time.Now()
			return txmq.RetryAfter(errors.New("still down"), 500*time.Millisecond)
		case string(d.Body) == "flaky":
			if since := time.Since(retried); since < 400*time.Millisecond {
				return fmt.Errorf("redelivered %s after RetryAfter 500ms", since)
			}
		case string(d.Body) == "slow":
			// Three ack deadlines: only the extensions keep it ours.
			time.Sleep(3 * time.Second)
		}
		return nil
	})
	txmqtest.CheckFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) < 4 {
			return fmt.Errorf("deliveries so far: %q", seen)
		}
		return nil
	})
	admin := rb.admin(t)
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		g, err := admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "g"})
		if err != nil {
			return err
		}
		if lag := g.Topics[0].Lag; lag != 0 {
			return fmt.Errorf("lag %d", lag)
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"flaky#1 ", "flaky#2 db down", "flaky#3 still down", "slow#1 "}, seen,
		"in key order, attempts counted, the slow one never redelivered")
}
