package checkback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// One check: calling a producer and proposing what its answer means.

// Outcome is what one check-back found.
type Outcome struct {
	Answer   txmqv1.Resolution // UNSPECIFIED when there was no answer
	Instance string
	Endpoint string
	Err      error
	// Reached: the check got to a producer (counts against max_checks).
	Reached bool
}

// process handles one due message: expire it, or check it and apply the
// answer. It gives back the call slot (called) before it proposes.
func (s *Scheduler) process(ctx context.Context, h *storepb.Half, pol Policy) {
	now := s.cfg.Now()
	if s.tooOld(h, pol, now) {
		s.called(h)
		s.expire(ctx, h, pol, "older than max_half_age")
		return
	}
	if h.CheckAttempts >= pol.MaxChecks {
		s.called(h)
		s.expire(ctx, h, pol, "check-backs used up")
		return
	}
	out := s.call(ctx, h, pol)
	s.called(h)
	if ctx.Err() != nil {
		return
	}
	s.apply(ctx, h, pol, out)
}

// call asks one live instance of the group (round robin), or the group's
// static callback.
func (s *Scheduler) call(ctx context.Context, h *storepb.Half, pol Policy) Outcome {
	var out Outcome
	ep := pol.Callback
	if in, ok := s.reg.Pick(h.ProducerGroup); ok {
		ep, out.Instance = in.Endpoint, in.ID
	}
	if ep.IsZero() {
		out.Err = fmt.Errorf("%w: no instance of producer group %q is registered", ErrNotReached, h.ProducerGroup)
		s.observe(h.ProducerGroup, "no_instance", 0)
		return out
	}
	start := s.cfg.Now()
	defer func() { s.observe(h.ProducerGroup, result(out), s.cfg.Now().Sub(start)) }()
	out.Endpoint = ep.String()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	ans, err := s.cfg.Caller.Check(cctx, ep, &txmqv1.CheckTransactionRequest{
		MessageId:     h.Id,
		Topic:         h.Topic,
		ProducerGroup: h.ProducerGroup,
		TransactionId: h.TransactionId,
		Key:           h.Key,
		Properties:    h.Properties,
		Body:          h.Body,
		Attempt:       h.CheckAttempts + 1,
		CreatedAt:     timestamppb.New(time.Unix(0, h.CreatedAt)),
	})
	out.Reached = !errors.Is(err, ErrNotReached)
	if err != nil {
		if cctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %s: %w", s.cfg.CallTimeout, err)
		}
		out.Err = err
		return out
	}
	out.Answer = ans
	return out
}

func (s *Scheduler) observe(group, result string, took time.Duration) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(group, result, took)
	}
}

// result names an outcome for metrics.
func result(out Outcome) string {
	switch {
	case out.Err == nil && out.Answer == txmqv1.Resolution_RESOLUTION_COMMIT:
		return "commit"
	case out.Err == nil && out.Answer == txmqv1.Resolution_RESOLUTION_ROLLBACK:
		return "rollback"
	case out.Err == nil:
		return "unknown"
	case !out.Reached:
		return "not_reached"
	case errors.Is(out.Err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// apply proposes what an outcome means for the message.
func (s *Scheduler) apply(ctx context.Context, h *storepb.Half, pol Policy, out Outcome) {
	log := s.log.With("msg_id", h.Id, "tx_id", h.TransactionId, "producer_group", h.ProducerGroup, "topic", h.Topic,
		"instance", out.Instance, "attempt", h.CheckAttempts+1)
	var res raftpb.Resolution
	switch out.Answer {
	case txmqv1.Resolution_RESOLUTION_COMMIT:
		res = raftpb.Resolution_RESOLUTION_COMMIT
	case txmqv1.Resolution_RESOLUTION_ROLLBACK:
		res = raftpb.Resolution_RESOLUTION_ROLLBACK
	}
	// An EXPIRED message is only checked when an operator asks (CheckNow):
	// the answer resolves it on the operator's behalf, and no answer
	// leaves it parked.
	expired := h.State == storepb.HalfState_HALF_STATE_EXPIRED
	source := storepb.Source_SOURCE_CHECKBACK
	if expired {
		source = storepb.Source_SOURCE_OPERATOR
	}
	if res != raftpb.Resolution_RESOLUTION_UNSPECIFIED {
		_, err := s.prop.Resolve(ctx, s.cfg.Now(), &raftpb.Resolve{
			MessageId: h.Id, Resolution: res, Source: source,
		})
		switch {
		case err == nil:
			log.Info("check-back resolved half message", "resolution", res.String())
		case errors.Is(err, raftlog.ErrRefused):
			log.Info("check-back answer arrived after the message was resolved; nothing changes", "answer", res.String(), "err", err)
		default:
			log.Warn("check-back answer not applied; the message will be checked again", "err", err)
		}
		return
	}
	if expired {
		log.Info("check-back of an expired half message got no resolution; it stays EXPIRED", "reached", out.Reached, "err", out.Err)
		return
	}

	now := s.cfg.Now()
	attempts := h.CheckAttempts
	if out.Reached {
		attempts++
	}
	errMsg := "answered UNKNOWN"
	if out.Err != nil {
		errMsg = out.Err.Error()
	}
	var delay time.Duration
	if attempts == 0 {
		delay = pol.Backoff
	} else {
		delay = pol.Backoff << min(attempts-1, 30)
	}
	delay = time.Duration(float64(min(delay, pol.MaxBackoff)) * s.cfg.Jitter())
	next := now.Add(delay)
	if deadline := time.Unix(0, h.CreatedAt).Add(pol.MaxHalfAge); next.After(deadline) {
		next = deadline
	}
	_, err := s.prop.RecordCheck(ctx, now, &raftpb.RecordCheck{
		MessageId: h.Id, Reached: out.Reached, Error: errMsg, NextCheckAt: next.UnixNano(),
	})
	if err != nil {
		if !errors.Is(err, raftlog.ErrRefused) {
			log.Warn("check-back outcome not recorded", "err", err)
		}
		return
	}
	log.Info("check-back unresolved", "reason", errMsg, "reached", out.Reached, "next_check_at", next)
	if attempts >= pol.MaxChecks {
		s.expire(ctx, h, pol, fmt.Sprintf("%d check-backs got no resolution", attempts))
	}
}

func (s *Scheduler) expire(ctx context.Context, h *storepb.Half, pol Policy, why string) {
	_, err := s.prop.Expire(ctx, s.cfg.Now(), &raftpb.Expire{MessageId: h.Id, Rollback: pol.Rollback})
	log := s.log.With("msg_id", h.Id, "tx_id", h.TransactionId, "producer_group", h.ProducerGroup, "topic", h.Topic)
	switch {
	case err == nil && pol.Rollback:
		log.Warn("half message expired and rolled back", "why", why, "attempts", h.CheckAttempts)
	case err == nil:
		log.Warn("half message expired; parked for an operator (brokerctl half list --state expired)", "why", why, "attempts", h.CheckAttempts)
	case errors.Is(err, raftlog.ErrRefused):
	default:
		log.Warn("expiry not applied; will retry", "err", err)
	}
}

// CheckNow checks one pending or expired message at once (brokerctl half
// check) and applies the answer like a scheduled check; an expired message
// is resolved by the answer as if by an operator (only operators resolve
// expired messages), and stays EXPIRED without one. It returns the outcome
// and the message as it is afterwards.
func (s *Scheduler) CheckNow(ctx context.Context, id string) (Outcome, *storepb.Half, error) {
	var h *storepb.Half
	var pol Policy
	err := s.store.ReadSchedule(func(tx Schedule) error {
		var err error
		if h, err = tx.Half(id); err != nil {
			return err
		}
		pol, err = s.Policy(tx, h.ProducerGroup)
		return err
	})
	if err != nil {
		return Outcome{}, nil, err
	}
	if h.State != storepb.HalfState_HALF_STATE_PENDING && h.State != storepb.HalfState_HALF_STATE_EXPIRED {
		return Outcome{}, h, fmt.Errorf("%w: half message %s is %s; only pending and expired messages are checked", ErrNotPending, id, halfstore.StateName(h.State))
	}
	if !s.claim(h) {
		return Outcome{}, h, fmt.Errorf("%w: a check of half message %s is already running", ErrCheckRunning, id)
	}
	defer s.release(h)
	out := s.call(ctx, h, pol)
	s.called(h)
	if ctx.Err() != nil {
		return out, h, ctx.Err()
	}
	s.apply(ctx, h, pol, out)
	err = s.store.ReadSchedule(func(tx Schedule) error {
		var err error
		h, err = tx.Half(id)
		return err
	})
	return out, h, err
}
