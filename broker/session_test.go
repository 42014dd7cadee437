package broker

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// A session serves many writes in flight at once, answers each by its ID
// with what the unary call would have answered, and merges them into
// shared log entries.
func TestSessionPipelinesWrites(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	stream, err := tb.producer.Session(ctx)
	require.NoError(t, err)
	before, err := tb.Node().Status()
	require.NoError(t, err)
	const n = 200
	for i := 1; i <= n; i++ {
		require.NoError(t, stream.Send(&txmqv1.SessionRequest{Id: uint64(i), Kind: &txmqv1.SessionRequest_SendHalf{SendHalf: &txmqv1.SendHalfRequest{
			Topic: "orders", ProducerGroup: "shop", TransactionId: fmt.Sprint("tx", i), Body: []byte("x"),
		}}}))
	}
	halves := map[uint64]string{}
	for range n {
		r, err := stream.Recv()
		require.NoError(t, err)
		require.NotNil(t, r.GetSendHalf(), "request %d: %v", r.Id, r.GetError())
		halves[r.Id] = r.GetSendHalf().MessageId
	}
	require.Len(t, halves, n, "one answer per request")
	after, err := tb.Node().Status()
	require.NoError(t, err)
	t.Logf("%d writes in %d log entries", n, after.LastLogIndex-before.LastLogIndex)
	require.Less(t, after.LastLogIndex-before.LastLogIndex, uint64(n))

	// Commits, a conflict and a bad request, answered each in its own way;
	// a one-way commit gets no answer and is applied.
	commit := func(id uint64, msgID string, res txmqv1.Resolution, oneway bool) *txmqv1.SessionRequest {
		return &txmqv1.SessionRequest{Id: id, Oneway: oneway, Kind: &txmqv1.SessionRequest_EndTransaction{EndTransaction: &txmqv1.EndTransactionRequest{
			Target: &txmqv1.EndTransactionRequest_MessageId{MessageId: msgID}, Resolution: res,
		}}}
	}
	require.NoError(t, stream.Send(commit(1001, halves[1], txmqv1.Resolution_RESOLUTION_COMMIT, false)))
	require.NoError(t, stream.Send(commit(1002, halves[2], txmqv1.Resolution_RESOLUTION_ROLLBACK, false)))
	require.NoError(t, stream.Send(commit(1003, halves[3], txmqv1.Resolution_RESOLUTION_COMMIT, true)))
	require.NoError(t, stream.Send(&txmqv1.SessionRequest{Id: 1004, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "bad topic!", Body: []byte("x")}}}))
	got := map[uint64]*txmqv1.SessionResponse{}
	for range 3 {
		r, err := stream.Recv()
		require.NoError(t, err)
		got[r.Id] = r
	}
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, got[1001].GetEndTransaction().GetState())
	require.Equal(t, txmqv1.HalfState_HALF_STATE_ROLLED_BACK, got[1002].GetEndTransaction().GetState())
	require.Equal(t, int32(codes.InvalidArgument), got[1004].GetError().GetCode())
	require.Contains(t, got[1004].GetError().GetMessage(), "not a valid name")
	require.NotContains(t, got, uint64(1003), "a one-way request is not answered")
	txmqtest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		h, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: halves[3]})
		if err != nil {
			return err
		}
		if h.Message.State != txmqv1.HalfState_HALF_STATE_COMMITTED {
			return fmt.Errorf("the one-way commit is not applied yet: %s", h.Message.State)
		}
		return nil
	})

	// The opposite resolution of a committed message is refused as the
	// unary call refuses it.
	require.NoError(t, stream.Send(commit(1005, halves[1], txmqv1.Resolution_RESOLUTION_ROLLBACK, false)))
	r, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, int32(codes.FailedPrecondition), r.GetError().GetCode())
	require.Contains(t, r.GetError().GetMessage(), "COMMITTED")

	require.NoError(t, stream.CloseSend())
	_, err = stream.Recv()
	require.ErrorContains(t, err, "EOF")
}

// A malformed request ends the session with InvalidArgument; nothing of it
// is applied.
func TestSessionBadRequests(t *testing.T) {
	tb := startBroker(t, nil)
	for name, req := range map[string]*txmqv1.SessionRequest{
		"id 0":            {Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "t", Body: []byte("x")}}},
		"no kind":         {Id: 1},
		"one-way send":    {Id: 1, Oneway: true, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "t", Body: []byte("x")}}},
		"one-way no kind": {Id: 1, Oneway: true},
	} {
		t.Run(name, func(t *testing.T) {
			stream, err := tb.producer.Session(ctxT(t))
			require.NoError(t, err)
			require.NoError(t, stream.Send(req))
			_, err = stream.Recv()
			require.Equal(t, codes.InvalidArgument, codeOf(err), "%v", err)
		})
	}
	topics, err := tb.admin.ListTopics(ctxT(t), &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	require.Empty(t, topics.Topics)
}

// A follower answers each request with Unavailable and the leader's
// address.
func TestClusterSessionOnAFollower(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader, f := c.Leader(), c.Follower()
	stream, err := f.producer.Session(ctxT(t))
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SessionRequest{Id: 7, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "t", Body: []byte("x")}}}))
	r, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, uint64(7), r.Id)
	require.Equal(t, int32(codes.Unavailable), r.GetError().GetCode())
	require.Equal(t, leader.Addr(), r.GetError().GetNotLeader().GetLeaderAddress())
	c.VerifyStores()
}

// A consumer's ack and a one-way commit are the writes that may wait for
// company: while writes come, each goes in the log entry of the next one
// rather than in an entry of its own. With a linger of a minute, neither
// takes effect before the next write, which itself is answered at once.
func TestAckAndOnewayCommitRideWithTheNextWrite(t *testing.T) {
	tb := startBroker(t, func(cfg *Config) { cfg.Raft.Linger = time.Minute })
	ctx := ctxT(t)
	send := func(body string) {
		t.Helper()
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte(body)})
		require.NoError(t, err)
	}
	sub := subscribe(t, tb, "orders", "points", 0)
	send("first")
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)

	sub.ack(d.MessageId)
	for quiet, waiting := time.After(300*time.Millisecond), true; waiting; {
		select {
		case m := <-sub.msgs:
			require.Nil(t, m.GetAckConfirm(), "the ack took effect before the next write")
		case <-quiet:
			waiting = false
		}
	}
	send("second")
	confirmed, delivered := false, false
	for deadline := time.After(10 * time.Second); !confirmed || !delivered; {
		select {
		case m := <-sub.msgs:
			confirmed = confirmed || slices.Contains(m.GetAckConfirm().GetMessageIds(), d.MessageId)
			delivered = delivered || string(m.GetDelivery().GetBody()) == "second"
		case <-deadline:
			t.Fatalf("after the next write: ack confirmed %v, the write delivered %v", confirmed, delivered)
		}
	}

	stream, err := tb.producer.Session(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SessionRequest{Id: 1, Kind: &txmqv1.SessionRequest_SendHalf{SendHalf: &txmqv1.SendHalfRequest{
		Topic: "orders", ProducerGroup: "shop", TransactionId: "tx1", Body: []byte("half"),
	}}}))
	r, err := stream.Recv()
	require.NoError(t, err)
	require.NotNil(t, r.GetSendHalf(), "%v", r.GetError())
	require.NoError(t, stream.Send(&txmqv1.SessionRequest{Id: 2, Oneway: true, Kind: &txmqv1.SessionRequest_EndTransaction{EndTransaction: &txmqv1.EndTransactionRequest{
		Target: &txmqv1.EndTransactionRequest_MessageId{MessageId: r.GetSendHalf().MessageId}, Resolution: txmqv1.Resolution_RESOLUTION_COMMIT,
	}}}))
	require.Nil(t, sub.next(300*time.Millisecond), "the one-way commit took effect before the next write")
	send("third")
	got := map[string]bool{}
	for range 2 {
		m := sub.next(5 * time.Second)
		require.NotNil(t, m)
		got[string(m.Body)] = true
	}
	require.Equal(t, map[string]bool{"half": true, "third": true}, got)
}
