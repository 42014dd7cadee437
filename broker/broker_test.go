package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

func TestMain(m *testing.M) { txmqtest.VerifyTestMain(m) }

type testBroker struct {
	*Broker
	conn     *grpc.ClientConn
	producer txmqv1.ProducerServiceClient
	consumer txmqv1.ConsumerServiceClient
	admin    txmqv1.AdminServiceClient
}

// cluster is the harness's cluster of test brokers.
type cluster = txmqtest.Cluster[*testBroker]

// newCluster starts n brokers through the harness (see txmqtest), each
// configured by configure, when set, after the harness's settings. The
// brokers of a cluster snapshot often and keep a short log, so that
// followers catch up from snapshots too.
func newCluster(t testing.TB, n int, configure func(*Config), opts ...txmqtest.Option) *cluster {
	return txmqtest.NewCluster(t, n, func(s txmqtest.Spec) (*testBroker, error) {
		cfg := Config{Raft: s.Raft, GRPCListener: s.API, Join: s.Join, Logger: txmqtest.Logger()}
		if n > 1 {
			cfg.Raft.SnapshotThreshold = 64
			cfg.Raft.TrailingLogs = 16
		}
		if configure != nil {
			configure(&cfg)
		}
		b, err := Open(cfg)
		if err != nil {
			return nil, err
		}
		tb := &testBroker{Broker: b}
		if err := tb.dial(insecure.NewCredentials()); err != nil {
			b.Close()
			return nil, err
		}
		return tb, nil
	}, opts...)
}

// startBroker starts a single-node broker, configured by configure when
// set, and returns it once it leads.
func startBroker(t testing.TB, configure func(*Config)) *testBroker {
	return newCluster(t, 1, configure).Leader()
}

// dial connects the test's clients with creds, replacing any earlier
// connection.
func (tb *testBroker) dial(creds credentials.TransportCredentials) error {
	if tb.conn != nil {
		tb.conn.Close()
	}
	conn, err := grpc.NewClient(tb.Addr(), grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		return err
	}
	tb.conn = conn
	tb.producer = txmqv1.NewProducerServiceClient(conn)
	tb.consumer = txmqv1.NewConsumerServiceClient(conn)
	tb.admin = txmqv1.NewAdminServiceClient(conn)
	return nil
}

// Close closes the test's connection, then the broker.
func (tb *testBroker) Close() error {
	return errors.Join(tb.conn.Close(), tb.Broker.Close())
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func codeOf(err error) codes.Code { return status.Code(err) }

// unknownID has the shape of a message ID and names none.
const unknownID = "0000000000000000000000000000dead"

func sendHalf(t *testing.T, tb *testBroker, topic, group, tx, body string) string {
	t.Helper()
	r, err := tb.producer.SendHalf(ctxT(t), &txmqv1.SendHalfRequest{
		Topic: topic, ProducerGroup: group, TransactionId: tx, Body: []byte(body),
	})
	require.NoError(t, err)
	return r.MessageId
}

func end(tb *testBroker, ctx context.Context, id string, r txmqv1.Resolution) (*txmqv1.EndTransactionResponse, error) {
	return tb.producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{
		Target: &txmqv1.EndTransactionRequest_MessageId{MessageId: id}, Resolution: r,
	})
}

// subscription is a test consumer stream.
type subscription struct {
	t      *testing.T
	stream txmqv1.ConsumerService_SubscribeClient
	cancel context.CancelFunc
	msgs   chan *txmqv1.SubscribeResponse
	// err is the error that ended the stream, once msgs is closed.
	err error
}

func subscribe(t *testing.T, tb *testBroker, topic, group string, maxInFlight uint32) *subscription {
	t.Helper()
	return subscribeWith(t, context.Background(), tb, &txmqv1.SubscriptionStart{Topic: topic, ConsumerGroup: group, MaxInFlight: maxInFlight})
}

// subscribeWith subscribes with the context's metadata (a token).
func subscribeWith(t *testing.T, parent context.Context, tb *testBroker, start *txmqv1.SubscriptionStart) *subscription {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	stream, err := tb.consumer.Subscribe(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: start}}))
	first, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, first.GetSubscribed())
	s := &subscription{t: t, stream: stream, cancel: cancel, msgs: make(chan *txmqv1.SubscribeResponse, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(s.msgs)
		for {
			m, err := stream.Recv()
			if err != nil {
				s.err = err
				return
			}
			s.msgs <- m
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return s
}

// next waits for the next delivery, skipping ack confirmations.
func (s *subscription) next(timeout time.Duration) *txmqv1.Delivery {
	s.t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case m, ok := <-s.msgs:
			if !ok {
				s.t.Fatalf("stream ended while waiting for a delivery")
			}
			if d := m.GetDelivery(); d != nil {
				return d
			}
		case <-deadline:
			return nil
		}
	}
}

func (s *subscription) ack(ids ...string) {
	s.t.Helper()
	require.NoError(s.t, s.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: ids}}}))
}

// waitConfirm waits until every id is confirmed as durably acked.
func (s *subscription) waitConfirm(ids ...string) {
	s.t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case m, ok := <-s.msgs:
			require.True(s.t, ok, "stream ended before the ack was confirmed")
			for _, id := range m.GetAckConfirm().GetMessageIds() {
				delete(want, id)
			}
		case <-deadline:
			s.t.Fatalf("acks not confirmed: %v", want)
		}
	}
}

func TestHalfMessageInvisibleUntilCommit(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)

	committed := sendHalf(t, tb, "orders", "shop", "order-1:paid", "one")
	rolledBack := sendHalf(t, tb, "orders", "shop", "order-2:paid", "two")
	pending := sendHalf(t, tb, "orders", "shop", "order-3:paid", "three")

	sub := subscribe(t, tb, "orders", "points", 0)
	require.Nil(t, sub.next(300*time.Millisecond), "half messages are invisible")

	_, err := end(tb, ctx, rolledBack, txmqv1.Resolution_RESOLUTION_ROLLBACK)
	require.NoError(t, err)
	r, err := end(tb, ctx, committed, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, r.State)

	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, committed, d.MessageId)
	require.Equal(t, "one", string(d.Body))
	require.Equal(t, uint32(1), d.Attempt)
	require.Equal(t, "shop", d.ProducerGroup)
	require.Equal(t, "order-1:paid", d.TransactionId)
	require.NotNil(t, d.CommittedAt)
	sub.ack(d.MessageId)
	sub.waitConfirm(d.MessageId)
	require.Nil(t, sub.next(300*time.Millisecond), "the rolled-back and the pending message are never delivered")

	h, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: pending})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.Message.State)
	require.Equal(t, "three", string(h.Message.Body))
	require.NotNil(t, h.Message.NextCheckAt)
}

func TestHalfLifecycleRules(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)

	// SendHalf twice with the same group + tx: one message, one ID.
	first, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "t1", Body: []byte("a")})
	require.NoError(t, err)
	require.False(t, first.Duplicate)
	again, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "t1", Body: []byte("a")})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first.MessageId, again.MessageId)
	list, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{ProducerGroup: "shop"})
	require.NoError(t, err)
	require.Len(t, list.Messages, 1)

	// Rollback, then commit: FailedPrecondition naming the state.
	_, err = end(tb, ctx, first.MessageId, txmqv1.Resolution_RESOLUTION_ROLLBACK)
	require.NoError(t, err)
	_, err = end(tb, ctx, first.MessageId, txmqv1.Resolution_RESOLUTION_ROLLBACK)
	require.NoError(t, err, "rollback twice succeeds")
	_, err = end(tb, ctx, first.MessageId, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.Equal(t, codes.FailedPrecondition, codeOf(err))
	require.Contains(t, err.Error(), "ROLLED_BACK")

	// The operator cannot flip a resolved message either.
	_, err = tb.admin.ResolveHalfMessage(ctx, &txmqv1.ResolveHalfMessageRequest{MessageId: first.MessageId, Resolution: txmqv1.Resolution_RESOLUTION_COMMIT})
	require.Equal(t, codes.FailedPrecondition, codeOf(err))

	// Commit twice succeeds with the same sequence; then rollback fails.
	id := sendHalf(t, tb, "orders", "shop", "t2", "b")
	r1, err := tb.producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{
		Target:     &txmqv1.EndTransactionRequest_Transaction{Transaction: &txmqv1.TransactionRef{ProducerGroup: "shop", TransactionId: "t2"}},
		Resolution: txmqv1.Resolution_RESOLUTION_COMMIT,
	})
	require.NoError(t, err)
	require.Equal(t, id, r1.MessageId)
	r2, err := end(tb, ctx, id, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err)
	require.Equal(t, r1.Sequence, r2.Sequence)
	_, err = end(tb, ctx, id, txmqv1.Resolution_RESOLUTION_ROLLBACK)
	require.Equal(t, codes.FailedPrecondition, codeOf(err))
	require.Contains(t, err.Error(), "COMMITTED")

	// A rolled-back transaction ID stays taken: resending it returns the
	// tombstone, not a new message.
	again, err = tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "t1", Body: []byte("a")})
	require.NoError(t, err)
	require.Equal(t, first.MessageId, again.MessageId)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_ROLLED_BACK, again.State)

	for state, want := range map[txmqv1.HalfState]int{
		txmqv1.HalfState_HALF_STATE_PENDING:     0,
		txmqv1.HalfState_HALF_STATE_COMMITTED:   1,
		txmqv1.HalfState_HALF_STATE_ROLLED_BACK: 1,
		txmqv1.HalfState_HALF_STATE_UNSPECIFIED: 2,
	} {
		list, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{State: state})
		require.NoError(t, err)
		require.Len(t, list.Messages, want, state.String())
	}
}

func TestListHalfMessagesPages(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	want := map[string]bool{}
	for i := 0; i < 25; i++ {
		want[sendHalf(t, tb, "orders", "shop", fmt.Sprintf("tx-%d", i), "x")] = true
	}
	got := map[string]bool{}
	token := ""
	pages := 0
	for {
		r, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{State: txmqv1.HalfState_HALF_STATE_PENDING, Limit: 10, PageToken: token})
		require.NoError(t, err)
		pages++
		for _, m := range r.Messages {
			require.False(t, got[m.MessageId], "listed twice")
			got[m.MessageId] = true
		}
		if r.NextPageToken == "" {
			break
		}
		token = r.NextPageToken
	}
	require.Equal(t, want, got)
	require.Equal(t, 3, pages)
}

func TestPlainSendAndDedup(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	a, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "audit", Key: "k1", Body: []byte("x")})
	require.NoError(t, err)
	b, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "audit", Key: "k1", Body: []byte("x")})
	require.NoError(t, err)
	require.True(t, b.Duplicate)
	require.Equal(t, a.MessageId, b.MessageId)
	c, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "audit", Body: []byte("y"), Properties: map[string]string{"p": "v"}})
	require.NoError(t, err)
	require.Equal(t, uint64(2), c.Sequence)

	sub := subscribe(t, tb, "audit", "g", 0)
	d1, d2 := sub.next(5*time.Second), sub.next(5*time.Second)
	require.NotNil(t, d1)
	require.NotNil(t, d2)
	require.Equal(t, []string{a.MessageId, c.MessageId}, []string{d1.MessageId, d2.MessageId})
	require.Equal(t, "k1", d1.Key)
	require.Equal(t, map[string]string{"p": "v"}, d2.Properties)
	require.Nil(t, sub.next(200*time.Millisecond))
}

func TestRedeliveryAfterAckDeadline(t *testing.T) {
	tb := startBroker(t, func(cfg *Config) { cfg.AckDeadline = time.Second })
	ctx := ctxT(t)
	_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	sub := subscribe(t, tb, "t", "g", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, uint32(1), d.Attempt)
	// Not acked: it comes back after the deadline with the next attempt.
	start := time.Now()
	again := sub.next(5 * time.Second)
	require.NotNil(t, again)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
	require.Equal(t, d.MessageId, again.MessageId)
	require.Equal(t, uint32(2), again.Attempt)
	sub.ack(again.MessageId)
	sub.waitConfirm(again.MessageId)
	require.Nil(t, sub.next(600*time.Millisecond), "an acked message is not redelivered")
}

func TestSubscriberLeavingGivesBackItsMessages(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	for i := 0; i < 4; i++ {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	a := subscribe(t, tb, "t", "g", 2)
	got := []*txmqv1.Delivery{a.next(5 * time.Second), a.next(5 * time.Second)}
	require.NotNil(t, got[1])
	require.Nil(t, a.next(200*time.Millisecond), "max_in_flight 2 holds the rest back")

	b := subscribe(t, tb, "t", "g", 10)
	b1, b2 := b.next(5*time.Second), b.next(5*time.Second)
	require.NotNil(t, b2)
	require.ElementsMatch(t, []string{"2", "3"}, []string{string(b1.Body), string(b2.Body)})

	// a goes away without acking: its two come to b at once, long before
	// the 30 s ack deadline.
	a.cancel()
	r1, r2 := b.next(5*time.Second), b.next(5*time.Second)
	require.NotNil(t, r2)
	require.ElementsMatch(t, []string{got[0].MessageId, got[1].MessageId}, []string{r1.MessageId, r2.MessageId})
	require.Equal(t, uint32(2), r1.Attempt)

	g, err := tb.admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "g"})
	require.NoError(t, err)
	require.Len(t, g.Topics, 1)
	require.Equal(t, uint64(4), g.Topics[0].Lag)
	require.Equal(t, uint32(4), g.Topics[0].InFlight)
}

func TestStartLatestSkipsHistory(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("old")})
	require.NoError(t, err)
	stream, err := tb.consumer.Subscribe(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
		Topic: "t", ConsumerGroup: "late", StartPosition: txmqv1.StartPosition_START_POSITION_LATEST,
	}}}))
	first, err := stream.Recv()
	require.NoError(t, err)
	require.True(t, first.GetSubscribed().Created)
	require.Equal(t, uint64(1), first.GetSubscribed().AckedThrough)
	_, err = tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("new")})
	require.NoError(t, err)
	m, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, "new", string(m.GetDelivery().Body))
}

// Acks go through Raft: after a restart an acked message is not
// redelivered, an unacked one is, and pending half messages stay pending.
func TestRestartKeepsAcksAndPending(t *testing.T) {
	c := newCluster(t, 1, nil)
	tb := c.Leader()
	ctx := ctxT(t)
	var ids []string
	for i := 0; i < 3; i++ {
		id := sendHalf(t, tb, "orders", "shop", fmt.Sprint("c", i), fmt.Sprint("body", i))
		_, err := end(tb, ctx, id, txmqv1.Resolution_RESOLUTION_COMMIT)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	pending := sendHalf(t, tb, "orders", "shop", "p", "pending")
	sub := subscribe(t, tb, "orders", "points", 0)
	for i := 0; i < 3; i++ {
		require.NotNil(t, sub.next(5*time.Second))
	}
	sub.ack(ids[0], ids[2])
	sub.waitConfirm(ids[0], ids[2])
	sub.cancel()
	// The lost stream is a failed attempt of ids[1]: let it be applied
	// before stopping.
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		g, err := tb.admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"})
		if err != nil || g.Topics[0].Redeliveries != 1 {
			return fmt.Errorf("failure not recorded yet (%v)", err)
		}
		return nil
	})

	// The node comes back at the same API address, so that it has no new
	// address to announce: the restart then proposes nothing at all.
	c.Restart("n1")
	tb = c.Leader()
	require.Zero(t, tb.Node().AppliedByFSM(), "the restart re-applied log entries")
	ctx = ctxT(t)
	sub = subscribe(t, tb, "orders", "points", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, ids[1], d.MessageId)
	require.Nil(t, sub.next(300*time.Millisecond))
	h, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: pending})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.Message.State)
}

func TestBadInput(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	big := make([]byte, DefaultMaxMessage+1)
	cases := []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"empty body", func() error {
			_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t"})
			return err
		}, codes.InvalidArgument, "empty"},
		{"body 4 MiB + 1", func() error {
			_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: big})
			return err
		}, codes.InvalidArgument, "over the limit"},
		{"half body 4 MiB + 1", func() error {
			_, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "t", ProducerGroup: "g", TransactionId: "x", Body: big})
			return err
		}, codes.InvalidArgument, "over the limit"},
		{"bad topic name", func() error {
			_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "no spaces!", Body: []byte("x")})
			return err
		}, codes.InvalidArgument, "not a valid name"},
		{"topic too long", func() error {
			_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: strings.Repeat("a", 128), Body: []byte("x")})
			return err
		}, codes.InvalidArgument, "not a valid name"},
		{"reserved topic", func() error {
			_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "txmq.dlq", Body: []byte("x")})
			return err
		}, codes.InvalidArgument, "reserved"},
		{"missing tx ID", func() error {
			_, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "t", ProducerGroup: "g", Body: []byte("x")})
			return err
		}, codes.InvalidArgument, "transaction_id"},
		{"missing producer group", func() error {
			_, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "t", TransactionId: "x", Body: []byte("x")})
			return err
		}, codes.InvalidArgument, "producer_group"},
		{"check_after out of range", func() error {
			_, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "t", ProducerGroup: "g", TransactionId: "x", Body: []byte("x"), CheckAfter: durationpb.New(2 * time.Hour)})
			return err
		}, codes.InvalidArgument, "check_after"},
		{"unknown message ID", func() error {
			_, err := end(tb, ctx, unknownID, txmqv1.Resolution_RESOLUTION_COMMIT)
			return err
		}, codes.NotFound, unknownID},
		{"malformed message ID", func() error {
			_, err := end(tb, ctx, "0000nope", txmqv1.Resolution_RESOLUTION_COMMIT)
			return err
		}, codes.InvalidArgument, "0000nope"},
		{"unknown transaction", func() error {
			_, err := tb.producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{
				Target:     &txmqv1.EndTransactionRequest_Transaction{Transaction: &txmqv1.TransactionRef{ProducerGroup: "g", TransactionId: "nope"}},
				Resolution: txmqv1.Resolution_RESOLUTION_COMMIT,
			})
			return err
		}, codes.NotFound, "nope"},
		{"no target", func() error {
			_, err := tb.producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{Resolution: txmqv1.Resolution_RESOLUTION_COMMIT})
			return err
		}, codes.InvalidArgument, "message_id"},
		{"resolution unknown", func() error {
			_, err := end(tb, ctx, unknownID, txmqv1.Resolution_RESOLUTION_UNKNOWN)
			return err
		}, codes.InvalidArgument, "COMMIT or ROLLBACK"},
		{"get unknown", func() error {
			_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: unknownID})
			return err
		}, codes.NotFound, unknownID},
		{"get malformed", func() error {
			_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: "nope"})
			return err
		}, codes.InvalidArgument, "not a txmq message ID"},
		{"describe unknown group", func() error {
			_, err := tb.admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "nobody"})
			return err
		}, codes.NotFound, "nobody"},
		{"subscribe without start", func() error {
			stream, err := tb.consumer.Subscribe(ctx)
			require.NoError(t, err)
			require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{}}}))
			_, err = stream.Recv()
			return err
		}, codes.InvalidArgument, "SubscriptionStart"},
		{"subscribe bad group", func() error {
			stream, err := tb.consumer.Subscribe(ctx)
			require.NoError(t, err)
			require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{Topic: "t", ConsumerGroup: "a/b"}}}))
			_, err = stream.Recv()
			return err
		}, codes.InvalidArgument, "consumer_group"},
		{"registration without group", func() error {
			_, err := tb.producer.RegisterProducer(ctx, &txmqv1.RegisterProducerRequest{})
			return err
		}, codes.InvalidArgument, "producer_group"},
		{"registration without endpoint", func() error {
			_, err := tb.producer.RegisterProducer(ctx, &txmqv1.RegisterProducerRequest{ProducerGroup: "g", InstanceId: "i"})
			return err
		}, codes.InvalidArgument, "endpoint"},
		{"registration with a bad endpoint", func() error {
			_, err := tb.producer.RegisterProducer(ctx, &txmqv1.RegisterProducerRequest{ProducerGroup: "g", InstanceId: "i",
				Endpoint: &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "nocolon"}}})
			return err
		}, codes.InvalidArgument, "host:port"},
		{"heartbeat of an unknown instance", func() error {
			_, err := tb.producer.Heartbeat(ctx, &txmqv1.HeartbeatRequest{ProducerGroup: "g", InstanceId: "i"})
			return err
		}, codes.NotFound, "register again"},
		{"group config: bad callback", func() error {
			bad := "ftp://x"
			_, err := tb.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "g", CallbackUrl: &bad}})
			return err
		}, codes.InvalidArgument, "grpc://"},
		{"group config: max_checks 0", func() error {
			zero := uint32(0)
			_, err := tb.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "g", MaxChecks: &zero}})
			return err
		}, codes.InvalidArgument, "max_checks"},
		{"join with a bad raft address", func() error {
			_, err := tb.admin.JoinCluster(ctx, &txmqv1.JoinClusterRequest{NodeId: "n9", RaftAddress: "nowhere"})
			return err
		}, codes.InvalidArgument, "raft_address"},
		{"join with a bad node ID", func() error {
			_, err := tb.admin.JoinCluster(ctx, &txmqv1.JoinClusterRequest{NodeId: "n 9", RaftAddress: "127.0.0.1:1"})
			return err
		}, codes.InvalidArgument, "node_id"},
		{"join with a RocketMQ address that is not IPv4", func() error {
			_, err := tb.admin.JoinCluster(ctx, &txmqv1.JoinClusterRequest{NodeId: "n9", RaftAddress: "127.0.0.1:1", RocketmqAddress: "[::1]:9876"})
			return err
		}, codes.InvalidArgument, "rocketmq_address"},
		{"check unknown message", func() error {
			_, err := tb.admin.CheckHalfMessage(ctx, &txmqv1.CheckHalfMessageRequest{MessageId: unknownID})
			return err
		}, codes.NotFound, unknownID},
		{"check malformed message ID", func() error {
			_, err := tb.admin.CheckHalfMessage(ctx, &txmqv1.CheckHalfMessageRequest{MessageId: "nope"})
			return err
		}, codes.InvalidArgument, "nope"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Equal(t, tc.code, codeOf(err), "%v", err)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
	// Nothing was stored, and the broker keeps serving.
	topics, err := tb.admin.ListTopics(ctx, &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	for _, tp := range topics.Topics {
		require.Zero(t, tp.LastSequence, "topic %s got a message from bad input", tp.Name)
	}
	list, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{})
	require.NoError(t, err)
	require.Empty(t, list.Messages)
	_, err = tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("fine")})
	require.NoError(t, err)
}

func TestAutoCreateTopicsOff(t *testing.T) {
	off := false
	tb := startBroker(t, func(cfg *Config) { cfg.AutoCreateTopics = &off })
	ctx := ctxT(t)
	_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")})
	require.Equal(t, codes.NotFound, codeOf(err))
	require.Contains(t, err.Error(), "auto-create")
	r, err := tb.admin.CreateTopic(ctx, &txmqv1.CreateTopicRequest{Name: "t"})
	require.NoError(t, err)
	require.True(t, r.Created)
	_, err = tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	topics, err := tb.admin.ListTopics(ctx, &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	require.Len(t, topics.Topics, 1)
	require.Equal(t, uint64(1), topics.Topics[0].LastSequence)
	require.Equal(t, uint64(1), topics.Topics[0].FirstSequence)
	require.Equal(t, uint64(1), topics.Topics[0].Messages)
	require.Positive(t, topics.Topics[0].Bytes)

	_, err = tb.admin.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "g", Topic: "t"})
	require.NoError(t, err)
	subscribe(t, tb, "t", "g", 0)
	again, err := tb.admin.CreateTopic(ctx, &txmqv1.CreateTopicRequest{Name: "t"})
	require.NoError(t, err)
	require.False(t, again.Created)
	require.Equal(t, []string{"g"}, again.Topic.ConsumerGroups, "an existing topic comes with its groups")
}

func TestClusterStatus(t *testing.T) {
	tb := startBroker(t, nil)
	st, err := tb.admin.ClusterStatus(ctxT(t), &txmqv1.ClusterStatusRequest{})
	require.NoError(t, err)
	require.Equal(t, "n1", st.NodeId)
	require.Equal(t, "LEADER", st.State)
	require.Equal(t, "n1", st.LeaderId)
	require.Len(t, st.Nodes, 1)
	require.True(t, st.Nodes[0].Leader)
	require.Equal(t, "VOTER", st.Nodes[0].Suffrage)
	require.NotZero(t, st.CommitIndex)
}

func TestListHalfMessagesLeavesBodiesOut(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	id := sendHalf(t, tb, "orders", "shop", "t1", "the body")
	list, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{})
	require.NoError(t, err)
	require.Len(t, list.Messages, 1)
	require.Empty(t, list.Messages[0].Body)
	require.Equal(t, uint32(len("the body")), list.Messages[0].BodySize)
	got, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(t, err)
	require.Equal(t, "the body", string(got.Message.Body))
}

// A group whose acks above its position outnumber what one read takes
// still gets the rest: the dispatcher reads past a batch of acked messages.
func TestDeliveryReadsPastAckedBatches(t *testing.T) {
	c := newCluster(t, 1, nil)
	tb := c.Leader()
	ctx := ctxT(t)
	const n = 600
	for i := 0; i < n; i++ {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	sub := subscribe(t, tb, "t", "g", 1000)
	var ids []string
	for i := 0; i < n; i++ {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		ids = append(ids, d.MessageId)
	}
	// Ack all but the first and the last: 598 acks above the position.
	sub.ack(ids[1 : n-1]...)
	sub.waitConfirm(ids[1 : n-1]...)
	sub.cancel()

	c.Restart("n1")
	tb = c.Leader()
	sub = subscribe(t, tb, "t", "g", 4)
	got := map[string]bool{}
	for i := 0; i < 2; i++ {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d, "delivery stalled behind acked messages")
		got[d.MessageId] = true
	}
	require.Equal(t, map[string]bool{ids[0]: true, ids[n-1]: true}, got)
}
