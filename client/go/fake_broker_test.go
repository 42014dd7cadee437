package txmq

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The real brokers of broker_test.go and cluster_test.go run
		// hashicorp/raft, which leaves these to end on their own after
		// Shutdown (accepted peer connections, the snapshot loop).
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"),
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*Raft).runSnapshots"),
		goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"),
		goleak.IgnoreAnyFunction("github.com/txmq/txmq/raftlog.waitApplied"),
	)
}

var discardLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// startServer serves the given services on addr ("127.0.0.1:0" for any
// port) until the test ends, and returns the server and its address.
func startServer(t *testing.T, addr string, register func(*grpc.Server)) (*grpc.Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	// Stop waits for the handlers too: the fakes' bookkeeping (a
	// WaitGroup.Add in a handler) must happen before the test's cleanup.
	srv := grpc.NewServer(grpc.WaitForHandlers(true))
	register(srv)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return srv, lis.Addr().String()
}

// deadAddr returns an address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := lis.Addr().String()
	require.NoError(t, lis.Close())
	return addr
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// notLeaderErr is what a follower answers, naming leader.
func notLeaderErr(t *testing.T, leader string) error {
	t.Helper()
	st, err := status.New(codes.Unavailable, "node is not the leader").
		WithDetails(&txmqv1.NotLeader{LeaderId: "leader", LeaderAddress: leader})
	require.NoError(t, err)
	return st.Err()
}

// fakeProducer is a scripted ProducerService. A nil func answers success.
// The funcs are set before the server starts.
type fakeProducer struct {
	txmqv1.UnimplementedProducerServiceServer
	send func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error)
	half func(context.Context, *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error)
	end  func(context.Context, *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error)
	// register and heartbeat script RegisterProducer and Heartbeat; by
	// default registration answers testHeartbeatInterval and heartbeats
	// succeed.
	register  func(context.Context, *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error)
	heartbeat func(context.Context, *txmqv1.HeartbeatRequest) (*txmqv1.HeartbeatResponse, error)

	mu            sync.Mutex
	calls         []string
	registrations []*txmqv1.RegisterProducerRequest
}

// testHeartbeatInterval is what the fake asks registered producers for.
const testHeartbeatInterval = 10 * time.Millisecond

func (f *fakeProducer) record(call string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
}

// Calls lists the calls received, in order.
func (f *fakeProducer) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeProducer) Send(ctx context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
	f.record("Send " + req.GetTopic())
	if f.send != nil {
		return f.send(ctx, req)
	}
	return &txmqv1.SendResponse{MessageId: "m-" + req.GetTopic(), Sequence: 7}, nil
}

func (f *fakeProducer) SendHalf(ctx context.Context, req *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
	f.record("SendHalf " + req.GetProducerGroup() + "/" + req.GetTransactionId())
	if f.half != nil {
		return f.half(ctx, req)
	}
	return &txmqv1.SendHalfResponse{MessageId: "h-" + req.GetTransactionId(), State: txmqv1.HalfState_HALF_STATE_PENDING}, nil
}

func (f *fakeProducer) EndTransaction(ctx context.Context, req *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
	target := req.GetMessageId()
	if tx := req.GetTransaction(); tx != nil {
		target = "tx:" + tx.GetProducerGroup() + "/" + tx.GetTransactionId()
	}
	f.record(fmt.Sprintf("EndTransaction %s %s", req.GetResolution(), target))
	if f.end != nil {
		return f.end(ctx, req)
	}
	state := txmqv1.HalfState_HALF_STATE_COMMITTED
	if req.GetResolution() == txmqv1.Resolution_RESOLUTION_ROLLBACK {
		state = txmqv1.HalfState_HALF_STATE_ROLLED_BACK
	}
	return &txmqv1.EndTransactionResponse{MessageId: target, State: state}, nil
}

func (f *fakeProducer) RegisterProducer(ctx context.Context, req *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
	f.record("RegisterProducer " + req.GetProducerGroup() + "/" + req.GetInstanceId())
	f.mu.Lock()
	f.registrations = append(f.registrations, req)
	f.mu.Unlock()
	if f.register != nil {
		return f.register(ctx, req)
	}
	return &txmqv1.RegisterProducerResponse{
		HeartbeatInterval: durationpb.New(testHeartbeatInterval),
		Lease:             durationpb.New(time.Second),
	}, nil
}

func (f *fakeProducer) Heartbeat(ctx context.Context, req *txmqv1.HeartbeatRequest) (*txmqv1.HeartbeatResponse, error) {
	f.record("Heartbeat " + req.GetProducerGroup() + "/" + req.GetInstanceId())
	if f.heartbeat != nil {
		return f.heartbeat(ctx, req)
	}
	return &txmqv1.HeartbeatResponse{LeaseExpiresAt: timestamppb.New(time.Now().Add(time.Second))}, nil
}

// Count is how many of the calls received start with prefix.
func (f *fakeProducer) Count(prefix string) int {
	n := 0
	for _, c := range f.Calls() {
		if strings.HasPrefix(c, prefix) {
			n++
		}
	}
	return n
}

// Registrations lists the RegisterProducer requests received, in order.
func (f *fakeProducer) Registrations() []*txmqv1.RegisterProducerRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.registrations)
}

// startProducerServer serves f on a free port and returns its address.
func startProducerServer(t *testing.T, f *fakeProducer) string {
	t.Helper()
	_, addr := startServer(t, "127.0.0.1:0", func(s *grpc.Server) { txmqv1.RegisterProducerServiceServer(s, f) })
	return addr
}

// newTestProducer returns a producer closed when the test ends.
func newTestProducer(t *testing.T, cfg ProducerConfig) *Producer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discardLogger
	}
	p, err := NewProducer(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p
}

// fakeConsumer is a scripted ConsumerService. Each Subscribe is a session:
// refuse may turn it down; otherwise the fake answers Subscribed, records
// acks (confirming each batch), nacks and extensions, and runs script until
// it returns, which ends the stream with script's error.
type fakeConsumer struct {
	txmqv1.UnimplementedConsumerServiceServer
	refuse func(n int) error
	script func(s *fakeSession) error

	mu       sync.Mutex
	sessions []*fakeSession
	// readers tracks the ack-reading goroutines, which outlive their
	// session's handler by the time it takes the stream to close.
	readers sync.WaitGroup
}

type fakeSession struct {
	n      int
	start  *txmqv1.SubscriptionStart
	stream grpc.BidiStreamingServer[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]
	ackCh  chan string

	sendMu sync.Mutex
	ended  bool

	mu      sync.Mutex
	acks    []string
	nacks   []*txmqv1.NackRequest
	extends []receivedExtend
}

// receivedExtend is an ExtendRequest and when the fake got it.
type receivedExtend struct {
	at  time.Time
	req *txmqv1.ExtendRequest
}

func (s *fakeSession) send(resp *txmqv1.SubscribeResponse) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	if s.ended {
		return io.EOF
	}
	return s.stream.Send(resp)
}

// deliver pushes one delivery with the fields a test looks at.
func (s *fakeSession) deliver(id string, attempt uint32) error {
	return s.send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: &txmqv1.Delivery{
		MessageId: id, Topic: s.start.GetTopic(), Attempt: attempt, Body: []byte("body of " + id),
	}}})
}

// waitAck blocks until id is acked on this session or the stream ends.
func (s *fakeSession) waitAck(id string) error {
	for {
		select {
		case got := <-s.ackCh:
			if got == id {
				return nil
			}
		case <-s.stream.Context().Done():
			return s.stream.Context().Err()
		}
	}
}

// Nacks lists the NackRequests received on this session, in order.
func (s *fakeSession) Nacks() []*txmqv1.NackRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.nacks)
}

// Extends lists the ExtendRequests received on this session, in order.
func (s *fakeSession) Extends() []receivedExtend {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.extends)
}

// Acked lists the message IDs acked on this session, in order.
func (s *fakeSession) Acked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.acks)
}

func (f *fakeConsumer) Subscribe(stream grpc.BidiStreamingServer[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	start := req.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "first request must be a SubscriptionStart")
	}
	f.mu.Lock()
	s := &fakeSession{n: len(f.sessions) + 1, start: start, stream: stream, ackCh: make(chan string, 1024)}
	f.sessions = append(f.sessions, s)
	f.mu.Unlock()
	if f.refuse != nil {
		if err := f.refuse(s.n); err != nil {
			return err
		}
	}
	if err := s.send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{
		Topic: start.GetTopic(), ConsumerGroup: start.GetConsumerGroup(), Created: s.n == 1,
	}}}); err != nil {
		return err
	}
	f.readers.Go(func() {
		for {
			req, err := stream.Recv()
			if err != nil {
				return
			}
			s.mu.Lock()
			switch {
			case req.GetNack() != nil:
				s.nacks = append(s.nacks, req.GetNack())
			case req.GetExtend() != nil:
				s.extends = append(s.extends, receivedExtend{at: time.Now(), req: req.GetExtend()})
			}
			ids := req.GetAck().GetMessageIds()
			s.acks = append(s.acks, ids...)
			s.mu.Unlock()
			if len(ids) == 0 {
				continue
			}
			for _, id := range ids {
				s.ackCh <- id
			}
			_ = s.send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_AckConfirm{AckConfirm: &txmqv1.AckConfirm{MessageIds: ids}}})
		}
	})
	err = f.script(s)
	s.sendMu.Lock()
	s.ended = true
	s.sendMu.Unlock()
	return err
}

// Session returns the nth session (1-based), or nil before it started.
func (f *fakeConsumer) Session(n int) *fakeSession {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n > len(f.sessions) {
		return nil
	}
	return f.sessions[n-1]
}

// SessionCount is the number of Subscribe calls received.
func (f *fakeConsumer) SessionCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sessions)
}

// Acked lists what session n acked, nil before it started.
func (f *fakeConsumer) Acked(n int) []string {
	if s := f.Session(n); s != nil {
		return s.Acked()
	}
	return nil
}

// Nacks lists the NackRequests of session n, nil before it started.
func (f *fakeConsumer) Nacks(n int) []*txmqv1.NackRequest {
	if s := f.Session(n); s != nil {
		return s.Nacks()
	}
	return nil
}

// Extends lists the ExtendRequests of session n, nil before it started.
func (f *fakeConsumer) Extends(n int) []receivedExtend {
	if s := f.Session(n); s != nil {
		return s.Extends()
	}
	return nil
}

// startConsumerServer serves f on addr ("127.0.0.1:0" for any port).
func startConsumerServer(t *testing.T, addr string, f *fakeConsumer) (*grpc.Server, string) {
	t.Helper()
	// Registered first so it runs after the server stopped and its streams
	// ended.
	t.Cleanup(f.readers.Wait)
	return startServer(t, addr, func(s *grpc.Server) { txmqv1.RegisterConsumerServiceServer(s, f) })
}

// untilStreamEnds is a script that keeps the stream open.
func untilStreamEnds(s *fakeSession) error {
	<-s.stream.Context().Done()
	return nil
}
