package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/internal/txmqtest"
)

// A long lease, so that an instance that is gone was unregistered, not
// timed out.
func longLease(cfg *Config) {
	cfg.CheckBack = checkback.Config{HeartbeatInterval: time.Minute, Lease: 10 * time.Minute}
}

// producerSession is a raw producer session in a test.
type producerSession struct {
	t      *testing.T
	stream txmqv1.ProducerService_SessionClient
	cancel context.CancelFunc
}

func openProducerSession(t *testing.T, tb *testBroker) *producerSession {
	return openProducerSessionWith(t, context.Background(), tb)
}

// openProducerSessionWith opens a session with the context's metadata (a
// token).
func openProducerSessionWith(t *testing.T, parent context.Context, tb *testBroker) *producerSession {
	ctx, cancel := context.WithTimeout(parent, 30*time.Second)
	t.Cleanup(cancel)
	stream, err := tb.producer.Session(ctx)
	require.NoError(t, err)
	return &producerSession{t: t, stream: stream, cancel: cancel}
}

func (ps *producerSession) send(id uint64, req *txmqv1.SessionRequest) {
	ps.t.Helper()
	req.Id = id
	require.NoError(ps.t, ps.stream.Send(req))
}

func (ps *producerSession) recv() *txmqv1.SessionResponse {
	ps.t.Helper()
	r, err := ps.stream.Recv()
	require.NoError(ps.t, err)
	return r
}

// do sends a request and returns its answer, which must be the next.
func (ps *producerSession) do(req *txmqv1.SessionRequest) *txmqv1.SessionResponse {
	ps.t.Helper()
	ps.send(req.Id, req)
	r := ps.recv()
	require.Equal(ps.t, req.Id, r.Id)
	return r
}

func (ps *producerSession) register(id uint64, group, instance string) *txmqv1.SessionResponse {
	ps.t.Helper()
	ps.send(id, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Register{Register: &txmqv1.RegisterProducerRequest{
		ProducerGroup: group, InstanceId: instance,
	}}})
	return ps.recv()
}

func (ps *producerSession) answer(id, check uint64, res txmqv1.Resolution) {
	ps.t.Helper()
	ps.send(id, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_CheckAnswer{CheckAnswer: &txmqv1.CheckAnswer{CheckId: check, Resolution: res}}})
}

// listed is the endpoints of the registered instances of group, by
// instance ID.
func listed(t *testing.T, tb *testBroker, group string) map[string]*txmqv1.CallbackEndpoint {
	t.Helper()
	resp, err := tb.admin.ListProducers(ctxT(t), &txmqv1.ListProducersRequest{ProducerGroup: group})
	require.NoError(t, err)
	out := map[string]*txmqv1.CallbackEndpoint{}
	for _, in := range resp.Instances {
		out[in.InstanceId] = in.Endpoint
	}
	return out
}

func sendHalfAfter(t *testing.T, tb *testBroker, group, tx string) string {
	t.Helper()
	r, err := tb.producer.SendHalf(ctxT(t), &txmqv1.SendHalfRequest{
		Topic: "orders", ProducerGroup: group, TransactionId: tx, Body: []byte(tx), CheckAfter: durationpb.New(time.Second),
	})
	require.NoError(t, err)
	return r.MessageId
}

func halfOf(t *testing.T, tb *testBroker, id string) *txmqv1.HalfMessage {
	t.Helper()
	h, err := tb.admin.GetHalfMessage(ctxT(t), &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(t, err)
	return h.Message
}

// A producer registered on its session gets its check-backs down the
// session and answers them up it; answers that are wrong are refused one
// by one and the session goes on; the session ending unregisters the
// instance at once.
func TestSessionCheckBack(t *testing.T) {
	tb := startBroker(t, longLease)
	ps := openProducerSession(t, tb)

	r := ps.register(1, "shop", "shop-1")
	require.NotNil(t, r.GetRegister(), "%v", r.GetError())
	require.Equal(t, time.Minute, r.GetRegister().GetHeartbeatInterval().AsDuration())
	ep := listed(t, tb, "shop")["shop-1"]
	require.NotEmpty(t, ep.GetSession(), "registered with the session as its endpoint")
	require.Empty(t, ep.GetGrpcAddress())

	ps.send(2, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Heartbeat{Heartbeat: &txmqv1.HeartbeatRequest{ProducerGroup: "shop", InstanceId: "shop-1"}}})
	require.NotNil(t, ps.recv().GetHeartbeat())
	ps.send(3, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Heartbeat{Heartbeat: &txmqv1.HeartbeatRequest{ProducerGroup: "shop", InstanceId: "shop-2"}}})
	require.Equal(t, int32(codes.NotFound), ps.recv().GetError().GetCode(), "a heartbeat of an instance not registered on the session")

	id := sendHalfAfter(t, tb, "shop", "order-1")
	chk := ps.recv().GetCheck()
	require.NotNil(t, chk, "the check-back comes down the session")
	require.Equal(t, id, chk.GetRequest().GetMessageId())
	require.Equal(t, "order-1", chk.GetRequest().GetTransactionId())
	require.Equal(t, uint32(1), chk.GetRequest().GetAttempt())
	require.Positive(t, chk.GetTimeout().AsDuration())

	// Bad answers: each refused on its own, nothing resolved.
	ps.answer(4, chk.CheckId+100, txmqv1.Resolution_RESOLUTION_COMMIT)
	e := ps.recv()
	require.Equal(t, uint64(4), e.Id)
	require.Equal(t, int32(codes.NotFound), e.GetError().GetCode(), "an answer to no check-back")
	require.Contains(t, e.GetError().GetMessage(), fmt.Sprintf("check-back %d", chk.CheckId+100))
	ps.answer(5, chk.CheckId, txmqv1.Resolution_RESOLUTION_UNSPECIFIED)
	e = ps.recv()
	require.Equal(t, int32(codes.InvalidArgument), e.GetError().GetCode(), "an answer without a resolution")
	require.Contains(t, e.GetError().GetMessage(), "answer COMMIT, ROLLBACK or UNKNOWN")
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, halfOf(t, tb, id).State)

	ps.answer(6, chk.CheckId, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NotNil(t, ps.recv().GetCheckAnswer())
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if h := halfOf(t, tb, id); h.State != txmqv1.HalfState_HALF_STATE_COMMITTED {
			return fmt.Errorf("half message is %s", h.State)
		}
		return nil
	})
	h := halfOf(t, tb, id)
	require.Equal(t, txmqv1.ResolutionSource_RESOLUTION_SOURCE_CHECKBACK, h.ResolutionSource)

	// The same answer again: that check-back is no longer waiting.
	ps.answer(7, chk.CheckId, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.Equal(t, int32(codes.NotFound), ps.recv().GetError().GetCode())

	// A registration naming an endpoint is refused, and changes nothing.
	ps.send(8, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Register{Register: &txmqv1.RegisterProducerRequest{
		ProducerGroup: "shop", InstanceId: "shop-3",
		Endpoint: &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "127.0.0.1:1"}},
	}}})
	require.Equal(t, int32(codes.InvalidArgument), ps.recv().GetError().GetCode())
	e = ps.register(9, "bad group!", "shop-3")
	require.Equal(t, int32(codes.InvalidArgument), e.GetError().GetCode())
	require.Contains(t, e.GetError().GetMessage(), "producer_group")
	require.Len(t, listed(t, tb, "shop"), 1)

	// The producer closes its session: the instance is gone at once,
	// its ten-minute lease notwithstanding.
	require.NoError(t, ps.stream.CloseSend())
	_, err := ps.stream.Recv()
	require.ErrorContains(t, err, "EOF")
	txmqtest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if l := listed(t, tb, "shop"); len(l) > 0 {
			return fmt.Errorf("still registered: %v", l)
		}
		return nil
	})
}

// A session that breaks while a check-back waits for its answer: the
// instance is unregistered at once, and the check did not reach a
// producer, so it uses up no attempt.
func TestSessionBreaksMidCheck(t *testing.T) {
	tb := startBroker(t, longLease)
	ps := openProducerSession(t, tb)
	require.NotNil(t, ps.register(1, "shop", "shop-1").GetRegister())
	id := sendHalfAfter(t, tb, "shop", "order-1")
	require.NotNil(t, ps.recv().GetCheck())

	ps.cancel()
	txmqtest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if l := listed(t, tb, "shop"); len(l) > 0 {
			return fmt.Errorf("still registered: %v", l)
		}
		if h := halfOf(t, tb, id); h.LastCheckError == "" {
			return fmt.Errorf("the check's outcome is not recorded yet")
		}
		return nil
	})
	h := halfOf(t, tb, id)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.State)
	require.Zero(t, h.CheckAttempts, "a check whose session broke did not reach the producer")
	require.Contains(t, h.LastCheckError, "session")
}

// A loopback callback is refused by a broker that is reached elsewhere,
// and taken by one on loopback.
func TestRegisterLoopbackCallback(t *testing.T) {
	loopback := []*txmqv1.CallbackEndpoint{
		{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "127.0.0.1:7430"}},
		{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "[::1]:7430"}},
		{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "localhost:7430"}},
		{Kind: &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: "http://127.0.0.2:8080/txmq/check"}},
		{Kind: &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: "https://LocalHost/check"}},
	}
	register := func(tb *testBroker, ep *txmqv1.CallbackEndpoint) error {
		_, err := tb.producer.RegisterProducer(ctxT(t), &txmqv1.RegisterProducerRequest{ProducerGroup: "shop", InstanceId: "shop-1", Endpoint: ep})
		return err
	}

	remote := startBroker(t, func(cfg *Config) {
		cfg.GRPCAdvertise = "10.20.30.40:7420"
		cfg.CallbackAllow = []string{"10.20.30.0/24", "*.internal"}
	})
	for _, ep := range loopback {
		err := register(remote, ep)
		require.Equal(t, codes.InvalidArgument, codeOf(err), "%v: %v", ep, err)
		require.ErrorContains(t, err, "is a loopback address")
		require.ErrorContains(t, err, "10.20.30.40:7420")
	}
	require.Empty(t, listed(t, remote, "shop"), "a refused registration registers nothing")
	require.NoError(t, register(remote, &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "10.20.30.41:7430"}}))
	require.NoError(t, register(remote, &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: "http://shop-1.internal/check"}}))

	local := startBroker(t, nil)
	for _, ep := range loopback {
		require.NoError(t, register(local, ep), "%v", ep)
	}
	err := register(local, &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_Session{Session: "x"}})
	require.Equal(t, codes.InvalidArgument, codeOf(err))
	require.ErrorContains(t, err, "Session stream")
}
