package txmq

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// Check-backs over the producer's own session (ProducerService.Session),
// the default: the instance registers on the session that carries its
// writes, the leader sends each check-back down it, and the answer goes
// up the same stream. The producer opens no port.

// registerOnSession registers the instance on the session to the leader
// and remembers that session: when it ends, the broker has forgotten the
// instance, and the loop registers it again at once. errNoSession: the
// broker's sessions carry no check-backs (an older broker).
func (c *callback) registerOnSession(ctx context.Context, req *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
	r, s, err := c.onSession(ctx, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Register{Register: req}})
	if err != nil {
		return nil, err
	}
	c.stream = s
	return r.GetRegister(), nil
}

// onSession sends req on the producer's session to the leader (the node
// the Conn picks, following NotLeader) and waits for its answer, retried
// as Conn.Invoke retries. It returns the session it went on.
func (c *callback) onSession(ctx context.Context, req *txmqv1.SessionRequest) (*txmqv1.SessionResponse, *sessionStream, error) {
	var resp *txmqv1.SessionResponse
	var on *sessionStream
	err := c.conn.Invoke(ctx, true, func(ctx context.Context, addr string, cc grpc.ClientConnInterface, _ ...grpc.CallOption) error {
		if c.pipe.unary.Load() {
			return errNoSession
		}
		s, err := c.pipe.streamTo(addr, cc)
		if err != nil {
			return err
		}
		resp, err = s.request(ctx, req)
		switch {
		case err == nil:
			on = s
		case status.Code(err) == codes.Unimplemented:
			c.pipe.unary.Store(true)
			return errNoSession
		case status.Code(err) == codes.InvalidArgument && resp == nil:
			// The broker ended the whole session over the request: it
			// does not know this kind of request.
			return errNoSession
		}
		return err
	})
	return resp, on, err
}

// request sends req on s and waits for its answer. An answer that is an
// error comes back as the status it stands for, with a nil response; the
// stream's end comes back as its status.
func (s *sessionStream) request(ctx context.Context, req *txmqv1.SessionRequest) (*txmqv1.SessionResponse, error) {
	id, ch, ok := s.register()
	if !ok {
		return nil, s.endedErr()
	}
	req.Id = id
	if ended, err := s.send(id, req); ended {
		return nil, s.endedErr()
	} else if err != nil {
		return nil, err
	}
	select {
	case a := <-ch:
		if a.err != nil {
			return nil, a.err
		}
		if e := a.resp.GetError(); e != nil {
			return a.resp, sessionErr(e)
		}
		return a.resp, nil
	case <-ctx.Done():
		s.unregister(id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

func (s *sessionStream) endedErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

// wait waits d, or until ctx ends (an error), or until the session the
// instance registered on ends (lost).
func (c *callback) wait(ctx context.Context, d time.Duration, registered bool) (lost bool, err error) {
	var ended <-chan struct{}
	if registered && c.viaSession && c.stream != nil {
		ended = c.stream.done
	}
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-t.C:
		return false, nil
	case <-ended:
		c.stream = nil
		return true, nil
	case <-ctx.Done():
		return false, ctx.Err()
	}
}

// answerOn answers a check-back that came down the session s, up s, in
// a goroutine of its own that close waits for.
func (c *callback) answerOn(s *sessionStream, chk *txmqv1.SessionCheck) {
	c.checksMu.Lock()
	defer c.checksMu.Unlock()
	if c.checksClosed {
		return
	}
	c.checks.Add(1)
	go func() {
		defer c.checks.Done()
		c.answer(s, chk)
	}()
}

func (c *callback) answer(s *sessionStream, chk *txmqv1.SessionCheck) {
	timeout := chk.GetTimeout().AsDuration()
	if timeout <= 0 {
		timeout = defaultCheckTimeout
	}
	ctx, cancel := context.WithTimeout(c.checksCtx, timeout)
	defer cancel()
	ans := &txmqv1.CheckAnswer{CheckId: chk.GetCheckId()}
	res, err := answerCheck(ctx, c.group, c.checker, chk.GetRequest(), c.log)
	if err != nil {
		ans.Error = err.Error()
	} else {
		ans.Resolution = res.proto()
	}
	// The answer may take as long as the check to go out (a busy stream).
	actx, acancel := context.WithTimeout(c.checksCtx, timeout)
	defer acancel()
	if _, err := s.request(actx, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_CheckAnswer{CheckAnswer: ans}}); err != nil {
		c.log.Warn("check-back answer not taken; the broker will ask again", "msg_id", chk.GetRequest().GetMessageId(), "err", err)
	}
}

// defaultCheckTimeout bounds a Checker when the broker gave no timeout.
const defaultCheckTimeout = 3 * time.Second

// drainChecks waits for the check-backs being answered on sessions, at
// most callbackDrainTimeout, then cancels them.
func (c *callback) drainChecks() {
	c.checksMu.Lock()
	c.checksClosed = true
	c.checksMu.Unlock()
	done := make(chan struct{})
	go func() {
		c.checks.Wait()
		close(done)
	}()
	c.drain(done, c.stopChecks)
	c.stopChecks()
}

// endpointText is where the broker sends check-backs, for logs.
func (c *callback) endpointText() string {
	if c.viaSession {
		return "the producer's session"
	}
	return c.callbackAddr()
}
