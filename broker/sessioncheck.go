package broker

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
)

// checkSession is a producer session's side of check-backs: the
// checkback.Session the registry holds for the instances registered on
// it, the check-backs sent down it that wait for their answer, and what
// registered on it, to forget when it ends.
type checkSession struct {
	b    *Broker
	peer string
	// down carries check-backs to the session's sender; ended is closed
	// when the session has ended.
	down  chan *txmqv1.SessionResponse
	ended chan struct{}

	mu        sync.Mutex
	nextID    uint64
	waiting   map[uint64]chan *txmqv1.CheckAnswer
	instances map[[2]string]struct{} // producer group, instance ID
}

func newCheckSession(ctx context.Context, b *Broker) *checkSession {
	addr := "unknown"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	return &checkSession{
		b:         b,
		peer:      addr,
		down:      make(chan *txmqv1.SessionResponse),
		ended:     make(chan struct{}),
		waiting:   map[uint64]chan *txmqv1.CheckAnswer{},
		instances: map[[2]string]struct{}{},
	}
}

// Peer implements checkback.Session.
func (cs *checkSession) Peer() string { return cs.peer }

func (cs *checkSession) endpoint() checkback.Endpoint { return checkback.Endpoint{Session: cs} }

// Check implements checkback.Session: it sends the check-back down the
// session and waits for its answer until ctx (the scheduler's call
// timeout) ends. A session that ended before the answer came did not
// reach the producer: its answer, if it was ever given, is lost.
func (cs *checkSession) Check(ctx context.Context, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	cs.mu.Lock()
	cs.nextID++
	id := cs.nextID
	answer := make(chan *txmqv1.CheckAnswer, 1)
	cs.waiting[id] = answer
	cs.mu.Unlock()
	defer func() {
		cs.mu.Lock()
		delete(cs.waiting, id)
		cs.mu.Unlock()
	}()
	chk := &txmqv1.SessionCheck{CheckId: id, Request: req}
	if d, ok := ctx.Deadline(); ok {
		chk.Timeout = durationpb.New(time.Until(d))
	}
	select {
	case cs.down <- &txmqv1.SessionResponse{Kind: &txmqv1.SessionResponse_Check{Check: chk}}:
	case <-cs.ended:
		return 0, fmt.Errorf("%w: the session of %s ended", checkback.ErrNotReached, cs.peer)
	case <-ctx.Done():
		return 0, fmt.Errorf("%w: the session of %s took no check-back: %w", checkback.ErrNotReached, cs.peer, ctx.Err())
	}
	select {
	case a := <-answer:
		if a.Error != "" {
			return 0, fmt.Errorf("session of %s: %s", cs.peer, a.Error)
		}
		return a.Resolution, nil
	case <-cs.ended:
		return 0, fmt.Errorf("%w: the session of %s ended before the producer answered", checkback.ErrNotReached, cs.peer)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// answer hands a check answer to the check-back waiting for it.
func (cs *checkSession) answer(a *txmqv1.CheckAnswer) (*txmqv1.CheckAnswerResponse, error) {
	switch a.Resolution {
	case txmqv1.Resolution_RESOLUTION_COMMIT, txmqv1.Resolution_RESOLUTION_ROLLBACK, txmqv1.Resolution_RESOLUTION_UNKNOWN:
	default:
		if a.Error == "" {
			return nil, invalidf("check answer %d has resolution %s and no error: answer COMMIT, ROLLBACK or UNKNOWN, or give the checker's error", a.CheckId, a.Resolution)
		}
	}
	cs.mu.Lock()
	ch, ok := cs.waiting[a.CheckId]
	delete(cs.waiting, a.CheckId)
	cs.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("%w: check-back %d (it timed out, was answered already, or was never sent)", errNoSuchCheck, a.CheckId)
	}
	ch <- a
	return &txmqv1.CheckAnswerResponse{}, nil
}

// register makes the session the instance's check-back endpoint.
func (cs *checkSession) register(req *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
	if err := checkInstance(req.ProducerGroup, req.InstanceId); err != nil {
		return nil, err
	}
	if req.Endpoint != nil {
		return nil, invalidf("a registration on a session has no endpoint: the session is where check-backs go")
	}
	// Under the lock, so that a session ending meanwhile (end) cannot
	// leave a registration behind it.
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.instances == nil {
		return nil, fmt.Errorf("%w: the session ended before the registration", errStreamBroken)
	}
	resp, err := cs.b.register(req, cs.endpoint())
	if err != nil {
		return nil, err
	}
	cs.instances[[2]string{req.ProducerGroup, req.InstanceId}] = struct{}{}
	return resp, nil
}

// end forgets, at once, the instances registered on the session (unless
// they registered elsewhere since), and fails the check-backs waiting on
// it.
func (cs *checkSession) end() {
	close(cs.ended)
	cs.mu.Lock()
	instances := cs.instances
	cs.instances = nil
	cs.mu.Unlock()
	for k := range instances {
		if cs.b.checks.Registry().Unregister(k[0], k[1], cs.endpoint()) {
			cs.b.log.Info("producer unregistered: its session ended", "group", k[0], "instance", k[1], "endpoint", cs.endpoint().String())
		}
	}
}

// registered reports whether an instance registered on the session.
func (cs *checkSession) registered() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.instances) > 0
}

// demotedCh is closed when this node next stops being the leader.
func (b *Broker) demotedCh() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.demoted
}

// demote ends, through demotedCh, the sessions that carry check-backs:
// their producers register again at once, on the new leader, instead of
// at their next heartbeat.
func (b *Broker) demote() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.demoted)
	b.demoted = make(chan struct{})
}
