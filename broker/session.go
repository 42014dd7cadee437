package broker

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/raftlog"
)

// maxSessionInFlight bounds the requests of one session being served at
// once; a client that sends more waits (gRPC's flow control holds it).
const maxSessionInFlight = 1024

// Session serves a producer's pipelined writes: every request is served
// as its unary call would be, concurrently, and answered as soon as it is
// done, so that the batcher merges a session's writes into shared log
// entries. It also carries the check-backs of the instances registered on
// it (sessioncheck.go). One goroutine sends the answers and the
// check-backs.
func (s *producerService) Session(stream txmqv1.ProducerService_SessionServer) error {
	ctx := stream.Context()
	cs := newCheckSession(ctx, s.b)
	// The session's writes are one writer's, whom the batcher's regroup
	// may wait for once answered.
	writes := raftlog.AsWriter(ctx, new(raftlog.Writer))
	out := make(chan *txmqv1.SessionResponse, 64)
	sent := make(chan error, 1)
	go func() {
		var err error
		for {
			var r *txmqv1.SessionResponse
			select {
			case a, ok := <-out:
				if !ok {
					sent <- err
					return
				}
				r = a
			case r = <-cs.down:
			}
			if err == nil {
				err = stream.Send(r)
			}
		}
	}()
	slots := make(chan struct{}, maxSessionInFlight)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		accepting = true
	)
	recvDone := make(chan error, 1)
	go func() {
		recvDone <- s.receive(ctx, stream, func(req *txmqv1.SessionRequest, refused error) {
			slots <- struct{}{}
			mu.Lock()
			if !accepting {
				mu.Unlock()
				return
			}
			wg.Add(1)
			mu.Unlock()
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				if req.Oneway {
					// Nobody waits for it: it may wait to share the
					// entry of the producer's next write.
					s.serve(raftlog.MayWait(writes), cs, req, refused)
					return
				}
				out <- s.serve(writes, cs, req, refused)
			}()
		})
	}()
	recvErr := s.wait(cs, recvDone)
	cs.end()
	mu.Lock()
	accepting = false
	mu.Unlock()
	wg.Wait()
	close(out)
	if err := <-sent; err != nil {
		return err
	}
	if errors.Is(recvErr, io.EOF) {
		return nil
	}
	return recvErr
}

// wait waits for the end of a session: the stream's (recvDone), the
// broker's, or, for a session that carries check-backs, the node's
// leadership.
func (s *producerService) wait(cs *checkSession, recvDone <-chan error) error {
	demoted := s.b.demotedCh()
	for {
		select {
		case err := <-recvDone:
			return err
		case <-s.b.stop:
			// The broker is stopping: answer what is in flight and end,
			// so that the gRPC server's graceful stop does not wait for an
			// idle session.
			return raftlog.ErrShutdown
		case <-demoted:
			// Its registrations are of no use on a follower: the session
			// ends (what is in flight is answered), and the producer
			// registers again on the new leader at once. (Should the node
			// lead again already, it ends without an error.)
			if cs.registered() {
				return s.b.leaderOnly()
			}
			demoted = s.b.demotedCh()
		}
	}
}

// receive hands each request of the stream to serve, with its refusal by
// the auth rules or limits if it has one, until the stream ends, a
// request is malformed, or the session's principal is no longer in the
// auth file.
func (s *producerService) receive(ctx context.Context, stream txmqv1.ProducerService_SessionServer, serve func(*txmqv1.SessionRequest, error)) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		switch {
		case req.Id == 0:
			return invalidf("session request id must not be 0")
		case req.Kind == nil:
			return invalidf("session request %d has no send, send_half, end_transaction, register, heartbeat or check_answer", req.Id)
		case req.Oneway && req.GetEndTransaction() == nil:
			return invalidf("session request %d: only end_transaction may be oneway", req.Id)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		refused := checkSessionRequest(ctx, req)
		if errors.Is(refused, errUnauthenticated) {
			return refused
		}
		serve(req, refused)
	}
}

// Session requests are counted and timed as calls of their own, named
// after the unary call they stand for.
const (
	sessionSend           = "/txmq.v1.ProducerService/Session:Send"
	sessionSendHalf       = "/txmq.v1.ProducerService/Session:SendHalf"
	sessionEndTransaction = "/txmq.v1.ProducerService/Session:EndTransaction"
	sessionRegister       = "/txmq.v1.ProducerService/Session:RegisterProducer"
	sessionHeartbeat      = "/txmq.v1.ProducerService/Session:Heartbeat"
	sessionCheckAnswer    = "/txmq.v1.ProducerService/Session:CheckAnswer"
)

// serve runs one request through its unary handler, or, for check-backs,
// through the session's own (cs); a refused request is answered with its
// refusal.
func (s *producerService) serve(ctx context.Context, cs *checkSession, req *txmqv1.SessionRequest, refused error) *txmqv1.SessionResponse {
	start := time.Now()
	resp := &txmqv1.SessionResponse{Id: req.Id}
	err := refused
	if err == nil {
		err = s.handle(ctx, cs, req, resp)
	}
	code := codes.OK
	if err != nil {
		if req.Oneway {
			s.b.log.Warn("one-way commit not applied; check-back will resolve the message", "err", err)
		}
		e := s.b.sessionError(err)
		code = codes.Code(e.Code)
		resp.Kind = &txmqv1.SessionResponse_Error{Error: e}
	}
	s.b.metrics.observeCall(sessionMethod(req), start, code)
	return resp
}

// sessionMethod names a session request after the call it stands for.
func sessionMethod(req *txmqv1.SessionRequest) string {
	switch req.Kind.(type) {
	case *txmqv1.SessionRequest_Send:
		return sessionSend
	case *txmqv1.SessionRequest_SendHalf:
		return sessionSendHalf
	case *txmqv1.SessionRequest_Register:
		return sessionRegister
	case *txmqv1.SessionRequest_Heartbeat:
		return sessionHeartbeat
	case *txmqv1.SessionRequest_CheckAnswer:
		return sessionCheckAnswer
	}
	return sessionEndTransaction
}

// handle serves one request and sets its answer in resp.
func (s *producerService) handle(ctx context.Context, cs *checkSession, req *txmqv1.SessionRequest, resp *txmqv1.SessionResponse) error {
	var err error
	switch k := req.Kind.(type) {
	case *txmqv1.SessionRequest_Send:
		var r *txmqv1.SendResponse
		if r, err = s.Send(ctx, k.Send); err == nil {
			resp.Kind = &txmqv1.SessionResponse_Send{Send: r}
		}
	case *txmqv1.SessionRequest_SendHalf:
		var r *txmqv1.SendHalfResponse
		if r, err = s.SendHalf(ctx, k.SendHalf); err == nil {
			resp.Kind = &txmqv1.SessionResponse_SendHalf{SendHalf: r}
		}
	case *txmqv1.SessionRequest_EndTransaction:
		var r *txmqv1.EndTransactionResponse
		if r, err = s.EndTransaction(ctx, k.EndTransaction); err == nil {
			resp.Kind = &txmqv1.SessionResponse_EndTransaction{EndTransaction: r}
		}
	case *txmqv1.SessionRequest_Register:
		var r *txmqv1.RegisterProducerResponse
		if r, err = cs.register(k.Register); err == nil {
			resp.Kind = &txmqv1.SessionResponse_Register{Register: r}
		}
	case *txmqv1.SessionRequest_Heartbeat:
		var r *txmqv1.HeartbeatResponse
		if r, err = s.b.heartbeat(k.Heartbeat, cs.endpoint()); err == nil {
			resp.Kind = &txmqv1.SessionResponse_Heartbeat{Heartbeat: r}
		}
	case *txmqv1.SessionRequest_CheckAnswer:
		var r *txmqv1.CheckAnswerResponse
		if r, err = cs.answer(k.CheckAnswer); err == nil {
			resp.Kind = &txmqv1.SessionResponse_CheckAnswer{CheckAnswer: r}
		}
	}
	return err
}

// sessionError is the status of err (toStatus) as a session answer.
func (b *Broker) sessionError(err error) *txmqv1.SessionError {
	st := status.Convert(b.toStatus(err))
	out := &txmqv1.SessionError{Code: int32(st.Code()), Message: st.Message()}
	for _, d := range st.Details() {
		if nl, ok := d.(*txmqv1.NotLeader); ok {
			out.NotLeader = nl
		}
	}
	return out
}
