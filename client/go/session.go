package txmq

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// pipeline carries a producer's writes on one ProducerService.Session
// stream to the node its Conn picks: many writes in flight on one stream,
// each answered by its ID, instead of one call each. A write is one Call of
// Conn.Invoke, so retries and leader following are Invoke's: a session
// answer means what the unary call's would, and a stream that breaks with
// requests in flight leaves their outcome unknown (Invoke retries them only
// when they are safe to repeat). A broker without Session gets unary calls.
type pipeline struct {
	log   *slog.Logger
	unary atomic.Bool
	// onCheck, set before the first session opens, takes the check-backs
	// that come down a session (checker_session.go).
	onCheck func(*sessionStream, *txmqv1.SessionCheck)

	mu     sync.Mutex
	cur    *sessionStream
	closed bool
}

// errNoSession: the broker does not serve Session; use the unary calls.
var errNoSession = errors.New("txmq: the broker has no producer sessions")

// sessionStream is one Session stream and the requests waiting on it.
type sessionStream struct {
	addr    string
	stream  txmqv1.ProducerService_SessionClient
	cancel  context.CancelFunc
	onCheck func(*sessionStream, *txmqv1.SessionCheck)
	sendMu  sync.Mutex
	done    chan struct{} // closed when the stream has ended

	mu      sync.Mutex
	nextID  uint64
	waiting map[uint64]chan sessionAnswer
	ended   error
}

type sessionAnswer struct {
	resp *txmqv1.SessionResponse
	err  error
}

// call sends req on the session to addr and waits for its answer (not for a
// one-way request: it returns once the request is sent). It fills opts'
// peer once the request went out, as a unary call would, so that Invoke can
// tell a request that may have taken effect from one that never left.
func (pl *pipeline) call(ctx context.Context, addr string, cc grpc.ClientConnInterface, opts []grpc.CallOption, req *txmqv1.SessionRequest) (*txmqv1.SessionResponse, error) {
	if pl.unary.Load() {
		return nil, errNoSession
	}
	s, err := pl.streamTo(addr, cc)
	if err != nil {
		return nil, err
	}
	id, ch, ok := s.register()
	if !ok {
		return nil, pl.ended(s)
	}
	req.Id = id
	if ended, err := s.send(id, req); ended {
		return nil, pl.ended(s)
	} else if err != nil {
		return nil, err
	}
	markSent(opts, addr)
	if req.Oneway {
		s.unregister(id)
		return nil, nil
	}
	select {
	case a := <-ch:
		if errors.Is(a.err, errNoSession) || status.Code(a.err) == codes.Unimplemented {
			pl.unary.Store(true)
			return nil, errNoSession
		}
		if a.err != nil {
			return nil, a.err
		}
		if e := a.resp.GetError(); e != nil {
			return nil, sessionErr(e)
		}
		return a.resp, nil
	case <-ctx.Done():
		s.unregister(id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// ended is the error that ended s, as the answer of a request sent on it.
func (pl *pipeline) ended(s *sessionStream) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if status.Code(s.ended) == codes.Unimplemented {
		pl.unary.Store(true)
		return errNoSession
	}
	return s.ended
}

// streamTo returns the open session to addr, opening one (and letting the
// one to another node finish its requests and end) when needed.
func (pl *pipeline) streamTo(addr string, cc grpc.ClientConnInterface) (*sessionStream, error) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.closed {
		return nil, ErrClosed
	}
	if s := pl.cur; s != nil && s.addr == addr && !s.isEnded() {
		return s, nil
	}
	if old := pl.cur; old != nil {
		go old.finish()
	}
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := txmqv1.NewProducerServiceClient(cc).Session(ctx)
	if err != nil {
		cancel()
		if status.Code(err) == codes.Unimplemented {
			pl.unary.Store(true)
			return nil, errNoSession
		}
		return nil, err
	}
	s := &sessionStream{addr: addr, stream: stream, cancel: cancel, onCheck: pl.onCheck, done: make(chan struct{}), waiting: map[uint64]chan sessionAnswer{}}
	pl.cur = s
	go s.receive(pl.log)
	return s, nil
}

// send sends the request registered under id. ended: the stream is done
// (the reason comes with Recv, in s.ended). A request that could not be
// sent (too large, say) may have broken the stream, so it is given up.
func (s *sessionStream) send(id uint64, req *txmqv1.SessionRequest) (ended bool, err error) {
	s.sendMu.Lock()
	err = s.stream.Send(req)
	s.sendMu.Unlock()
	if err == nil {
		return false, nil
	}
	s.unregister(id)
	if errors.Is(err, io.EOF) {
		<-s.done
		return true, nil
	}
	s.cancel()
	return false, err
}

// register reserves the next request ID; false once the stream ended.
func (s *sessionStream) register() (uint64, chan sessionAnswer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended != nil {
		return 0, nil, false
	}
	s.nextID++
	ch := make(chan sessionAnswer, 1)
	s.waiting[s.nextID] = ch
	return s.nextID, ch, true
}

func (s *sessionStream) unregister(id uint64) {
	s.mu.Lock()
	delete(s.waiting, id)
	s.mu.Unlock()
}

func (s *sessionStream) isEnded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended != nil
}

// receive hands each answer to its request, and each check-back to
// onCheck, until the stream ends, then fails the requests still waiting.
func (s *sessionStream) receive(log *slog.Logger) {
	defer close(s.done)
	defer s.cancel()
	for {
		resp, err := s.stream.Recv()
		if err != nil {
			s.fail(err, log)
			return
		}
		if chk := resp.GetCheck(); chk != nil {
			if s.onCheck != nil {
				s.onCheck(s, chk)
			}
			continue
		}
		s.mu.Lock()
		ch, ok := s.waiting[resp.Id]
		delete(s.waiting, resp.Id)
		s.mu.Unlock()
		if ok {
			ch <- sessionAnswer{resp: resp}
		}
	}
}

func (s *sessionStream) fail(err error, log *slog.Logger) {
	st := status.Convert(err)
	switch {
	case errors.Is(err, io.EOF):
		st = status.New(codes.Unavailable, "producer session ended")
	case st.Code() == codes.Canceled || st.Code() == codes.DeadlineExceeded:
		st = status.New(codes.Unavailable, "producer session cut short: "+st.Message())
	}
	if st.Code() == codes.Unavailable {
		// What was in flight may or may not have taken effect.
		st = status.New(codes.Unavailable, st.Message()+"; the outcome of the requests in flight is unknown")
	}
	s.mu.Lock()
	s.ended = st.Err()
	waiting := s.waiting
	s.waiting = nil
	s.mu.Unlock()
	if len(waiting) > 0 {
		log.Debug("producer session ended with requests in flight", "addr", s.addr, "requests", len(waiting), "err", st.Message())
	}
	for _, ch := range waiting {
		ch <- sessionAnswer{err: s.ended}
	}
}

// finish ends the stream once its requests are answered (the broker
// answers what it has, then ends), or after a grace period.
func (s *sessionStream) finish() {
	s.sendMu.Lock()
	_ = s.stream.CloseSend()
	s.sendMu.Unlock()
	select {
	case <-s.done:
	case <-time.After(sessionGrace):
		s.cancel()
		<-s.done
	}
}

// sessionGrace bounds how long a session that is given up keeps waiting
// for its answers.
const sessionGrace = 5 * time.Second

// close ends the current session; calls after it fail with ErrClosed.
func (pl *pipeline) close() {
	pl.mu.Lock()
	s := pl.cur
	pl.cur, pl.closed = nil, true
	pl.mu.Unlock()
	if s != nil {
		s.finish()
	}
}

// sessionErr is the status error a session answer stands for, with the
// NotLeader detail that Invoke follows.
func sessionErr(e *txmqv1.SessionError) error {
	st := status.New(codes.Code(e.GetCode()), e.GetMessage())
	if e.GetNotLeader() != nil {
		if d, err := st.WithDetails(e.GetNotLeader()); err == nil {
			st = d
		}
	}
	return st.Err()
}

// markSent fills the peer of a grpc.Peer option, as gRPC does once a call
// went out on a connection.
func markSent(opts []grpc.CallOption, addr string) {
	for _, o := range opts {
		if p, ok := o.(grpc.PeerCallOption); ok && p.PeerAddr != nil {
			p.PeerAddr.Addr = sessionAddr(addr)
		}
	}
}

// sessionAddr is the broker's address as a net.Addr.
type sessionAddr string

func (a sessionAddr) Network() string { return "tcp" }
func (a sessionAddr) String() string  { return string(a) }

// write runs one write on the producer's session (or, with a broker
// without sessions, as its unary call), retried as Conn.Invoke retries.
func (p *Producer) write(ctx context.Context, idempotent bool, req *txmqv1.SessionRequest) (*txmqv1.SessionResponse, error) {
	var resp *txmqv1.SessionResponse
	err := p.conn.Invoke(ctx, idempotent, func(ctx context.Context, addr string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		resp, err = p.pipe.call(ctx, addr, cc, opts, req)
		if errors.Is(err, errNoSession) {
			resp, err = unary(ctx, cc, req, opts)
		}
		return err
	})
	return resp, err
}

// unary runs a session request as its unary call.
func unary(ctx context.Context, cc grpc.ClientConnInterface, req *txmqv1.SessionRequest, opts []grpc.CallOption) (*txmqv1.SessionResponse, error) {
	c := txmqv1.NewProducerServiceClient(cc)
	out := &txmqv1.SessionResponse{}
	switch k := req.Kind.(type) {
	case *txmqv1.SessionRequest_Send:
		r, err := c.Send(ctx, k.Send, opts...)
		if err != nil {
			return nil, err
		}
		out.Kind = &txmqv1.SessionResponse_Send{Send: r}
	case *txmqv1.SessionRequest_SendHalf:
		r, err := c.SendHalf(ctx, k.SendHalf, opts...)
		if err != nil {
			return nil, err
		}
		out.Kind = &txmqv1.SessionResponse_SendHalf{SendHalf: r}
	case *txmqv1.SessionRequest_EndTransaction:
		r, err := c.EndTransaction(ctx, k.EndTransaction, opts...)
		if err != nil {
			return nil, err
		}
		out.Kind = &txmqv1.SessionResponse_EndTransaction{EndTransaction: r}
	}
	return out, nil
}
