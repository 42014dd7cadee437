package txmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// One subscription of a Consumer: its stream, the deliveries it tracks,
// the handlers it runs and the acks, nacks and extensions it sends.

// session is one Subscribe stream and what rides on it: the deliveries it
// brought that are not settled yet, and the queue of acks, nacks and
// extensions for its sender. Outcomes of handlers that outlive the stream
// are dropped, since the broker redelivers what it did not see settled.
type session struct {
	r   *run
	ctx context.Context // ends with the stream
	log *slog.Logger
	// out feeds the sender, the stream's only writer after the start.
	out chan outcome
	// wake tells the extender that a delivery arrived or was extended.
	wake chan struct{}

	mu      sync.Mutex
	pending map[*tracked]struct{}
}

// tracked is a delivery that is waiting for or running its handler.
// Its times are on the local clock.
type tracked struct {
	s       *session
	d       *Delivery
	arrived time.Time
	// window is the ack deadline the broker gave, as seen at arrival: what
	// an extension without a value (the group's ack deadline) buys.
	// Zero when the broker sent no deadline: nothing to extend.
	window time.Duration
	// set and deadline bound the ack deadline in force, since it was last
	// set (at arrival or by an extension).
	set, deadline time.Time
	settled       bool
}

// outcome is one request for the sender: an ack, a nack or an extension of
// the deliveries ids. done, when set, receives the result of sending it.
type outcome struct {
	kind      outcomeKind
	ids       []string
	delay     *time.Duration // nack: nil for the group's backoff
	errText   string         // nack
	terminate bool           // nack: to the dead-letter queue now
	extension *time.Duration // extend: nil for the group's ack deadline
	done      chan error
}

type outcomeKind int

const (
	outcomeAck outcomeKind = iota
	outcomeNack
	outcomeExtend
)

// runSession runs one Subscribe stream until it breaks or r.ctx ends, and
// says whether the broker confirmed the subscription.
// subscribe sends the subscription and reads the broker's answer.
func (r *run) subscribe(stream grpc.BidiStreamingClient[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]) (*txmqv1.Subscribed, error) {
	start := &txmqv1.SubscriptionStart{
		Topic:         r.c.cfg.Topic,
		ConsumerGroup: r.c.cfg.Group,
		StartPosition: startPositions[r.c.cfg.Start],
		MaxInFlight:   uint32(r.c.cfg.Prefetch),
		ClientId:      r.c.cfg.ClientID,
	}
	if !r.c.cfg.StartAt.IsZero() {
		start.StartPosition = txmqv1.StartPosition_START_POSITION_TIMESTAMP
		start.StartTime = timestamppb.New(r.c.cfg.StartAt)
	}
	// A failed Send only says the stream is gone; Recv tells why.
	if err := stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: start}}); err != nil {
		_, err = stream.Recv()
		return nil, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	sub := resp.GetSubscribed()
	if sub == nil {
		return nil, fmt.Errorf("txmq: broker answered the subscription with %T, not Subscribed", resp.GetKind())
	}
	return sub, nil
}

func (r *run) runSession(addr string, cc grpc.ClientConnInterface) (subscribed bool, err error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	stream, err := txmqv1.NewConsumerServiceClient(cc).Subscribe(ctx)
	if err != nil {
		return false, err
	}
	sub, err := r.subscribe(stream)
	if err != nil {
		return false, err
	}
	r.c.log.Info("subscribed", "addr", addr, "created", sub.GetCreated(), "acked_through", sub.GetAckedThrough())

	s := &session{
		r:   r,
		ctx: ctx,
		log: r.c.log.With("addr", addr),
		// With a slot per concurrent handler, handlers rarely wait for
		// the sender.
		out:     make(chan outcome, r.c.cfg.Concurrency),
		wake:    make(chan struct{}, 1),
		pending: make(map[*tracked]struct{}),
	}
	// The broker pushes at most Prefetch deliveries without an ack, so
	// the reader below never waits for room here.
	queue := make(chan *tracked, r.c.cfg.Prefetch)
	var helpers sync.WaitGroup
	helpers.Go(func() {
		s.send(stream)
		// A failed send means the stream is gone. End the session now,
		// rather than wait for Recv to notice.
		cancel()
	})
	helpers.Go(func() { s.dispatch(queue) })
	if r.c.cfg.MaxExtension > 0 {
		helpers.Go(s.extendLoop)
	}
	defer func() {
		cancel()
		helpers.Wait()
	}()

	for {
		resp, err := stream.Recv()
		if err != nil {
			return true, err
		}
		switch kind := resp.GetKind().(type) {
		case *txmqv1.SubscribeResponse_Delivery:
			t := s.track(kind.Delivery)
			select {
			case queue <- t:
			case <-ctx.Done():
				return true, fmt.Errorf("txmq: subscription to %s ended while sending", addr)
			}
		case *txmqv1.SubscribeResponse_AckConfirm:
			r.c.log.LogAttrs(ctx, slog.LevelDebug, "acks durable", slog.Int("count", len(kind.AckConfirm.GetMessageIds())))
		default:
			r.c.log.Debug("ignoring unexpected subscribe response", "kind", fmt.Sprintf("%T", kind))
		}
	}
}

var startPositions = map[StartPosition]txmqv1.StartPosition{
	StartEarliest: txmqv1.StartPosition_START_POSITION_EARLIEST,
	StartLatest:   txmqv1.StartPosition_START_POSITION_LATEST,
}

// track starts the bookkeeping of a delivery that just arrived.
func (s *session) track(pb *txmqv1.Delivery) *tracked {
	now := time.Now()
	d := toDelivery(pb, s.r.c.cfg.Group)
	t := &tracked{s: s, d: d, arrived: now, set: now, deadline: now}
	if !d.AckDeadline.IsZero() {
		// What is left has lost the time in transit, and the hosts'
		// clocks may differ: a deadline already past is extended at
		// once. A group's ack deadline is at least a second.
		left := d.AckDeadline.Sub(now)
		t.window = max(left, minExtension)
		t.deadline = now.Add(max(left, 0))
	}
	d.t = t
	s.mu.Lock()
	s.pending[t] = struct{}{}
	s.mu.Unlock()
	s.poke()
	return t
}

// settle ends the bookkeeping of t, whose handler returned or called
// Delivery.Term. It reports false when t was settled already.
func (s *session) settle(t *tracked) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.settled {
		return false
	}
	t.settled = true
	delete(s.pending, t)
	return true
}

func (s *session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// dispatch starts a handler for each queued delivery, in arrival order, as
// handler slots free up, until the session ends; deliveries still queued
// then are left to the broker to redeliver.
func (s *session) dispatch(queue <-chan *tracked) {
	for {
		var t *tracked
		select {
		case t = <-queue:
		case <-s.ctx.Done():
			return
		}
		select {
		case s.r.sem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		s.r.handlers.Go(func() { s.handle(t) })
	}
}

// handle runs the handler for t and queues its ack or nack on the stream
// that delivered it, unless that stream has ended.
func (s *session) handle(t *tracked) {
	defer func() { <-s.r.sem }()
	d := t.d
	err := s.r.h(s.r.ctx, d)
	if !s.settle(t) {
		s.logFor(d).Debug("handler returned after Delivery.Term; nothing more to send", "err", err)
		return
	}
	o := outcome{kind: outcomeAck, ids: []string{d.MessageID}}
	if err != nil {
		o = nack(d.MessageID, err)
		switch log := s.logFor(d); {
		case o.terminate:
			log.Warn("handler terminated the delivery; it goes to the dead-letter queue", "err", err)
		case o.delay != nil:
			log.Warn("handler failed; nacked", "err", err, "retry_after", *o.delay)
		default:
			log.Warn("handler failed; nacked, the broker redelivers after the group's backoff", "err", err)
		}
	}
	select {
	case s.out <- o:
	case <-s.ctx.Done():
		s.logFor(d).Debug("subscription ended before the outcome was sent; the broker will redeliver")
	}
}

// logFor is the session's logger with d's message ID and attempt, made
// only when there is something to log: a logger with attributes costs the
// handler's text or JSON formatting of them, which an acked delivery does
// not need.
func (s *session) logFor(d *Delivery) *slog.Logger {
	return s.log.With("msg_id", d.MessageID, "attempt", d.Attempt)
}

// nack is the outcome for a handler that returned err.
func nack(id string, err error) outcome {
	o := outcome{kind: outcomeNack, ids: []string{id}, errText: truncateUTF8(err.Error(), maxErrorText)}
	if _, ok := errors.AsType[*terminateError](err); ok {
		o.terminate = true
	} else if re, ok := errors.AsType[*retryError](err); ok {
		o.delay = &re.delay
	}
	return o
}

// term sends a terminating nack of t for Delivery.Term.
func (s *session) term(ctx context.Context, t *tracked, reason string) error {
	if !s.settle(t) {
		return fmt.Errorf("txmq: delivery %s is already acked or nacked", t.d.MessageID)
	}
	return s.sendWait(ctx, outcome{kind: outcomeNack, ids: []string{t.d.MessageID}, errText: truncateUTF8(reason, maxErrorText), terminate: true})
}

// sendWait queues o for the sender and waits until it is sent on the
// stream, for the calls a handler makes on its Delivery.
func (s *session) sendWait(ctx context.Context, o outcome) error {
	o.done = make(chan error, 1)
	lost := fmt.Errorf("txmq: the subscription that delivered %s ended; the broker will deliver it again", o.ids[0])
	select {
	case s.out <- o:
	case <-s.ctx.Done():
		return lost
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-o.done:
		if err != nil {
			return lost
		}
		return nil
	case <-s.ctx.Done():
		return lost
	case <-ctx.Done():
		return ctx.Err()
	}
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// send sends queued outcomes on stream, batching those already waiting,
// until the session ends or the stream fails.
func (s *session) send(stream grpc.BidiStreamingClient[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]) {
	for {
		var batch []outcome
		select {
		case <-s.ctx.Done():
			return
		case o := <-s.out:
			batch = append(batch, o)
		}
	fill:
		for {
			select {
			case o := <-s.out:
				batch = append(batch, o)
			default:
				break fill
			}
		}
		var err error
		for _, req := range requests(batch) {
			// On failure the stream is finished and its Recv returns
			// the reason, which ends the session.
			if err = stream.Send(req); err != nil {
				s.log.Debug("acks, nacks or extensions not sent; the broker will redeliver", "count", len(batch), "err", err)
				break
			}
		}
		for _, o := range batch {
			if o.done != nil {
				o.done <- err
			}
		}
		if err != nil {
			return
		}
	}
}

// requests turns a batch of outcomes into as few requests as the protocol
// allows: one ack, one nack per delay and error text, one extension per
// length. Extensions go first: one sent after the ack or nack of the same
// delivery would be ignored anyway.
func requests(batch []outcome) []*txmqv1.SubscribeRequest {
	type nackKey struct {
		delay     time.Duration
		delayed   bool
		errText   string
		terminate bool
	}
	type extendKey struct {
		extension time.Duration
		given     bool
	}
	var (
		acks        []string
		nacks       = map[nackKey]*txmqv1.NackRequest{}
		extends     = map[extendKey]*txmqv1.ExtendRequest{}
		nackOrder   []*txmqv1.NackRequest
		extendOrder []*txmqv1.ExtendRequest
	)
	for _, o := range batch {
		switch o.kind {
		case outcomeAck:
			acks = append(acks, o.ids...)
		case outcomeNack:
			k := nackKey{errText: o.errText, terminate: o.terminate}
			if o.delay != nil {
				k.delay, k.delayed = *o.delay, true
			}
			n, ok := nacks[k]
			if !ok {
				n = &txmqv1.NackRequest{Error: o.errText, Terminate: o.terminate}
				if k.delayed {
					n.Delay = durationpb.New(k.delay)
				}
				nacks[k] = n
				nackOrder = append(nackOrder, n)
			}
			n.MessageIds = append(n.MessageIds, o.ids...)
		case outcomeExtend:
			var k extendKey
			if o.extension != nil {
				k.extension, k.given = *o.extension, true
			}
			e, ok := extends[k]
			if !ok {
				e = &txmqv1.ExtendRequest{}
				if k.given {
					e.Extension = durationpb.New(k.extension)
				}
				extends[k] = e
				extendOrder = append(extendOrder, e)
			}
			e.MessageIds = append(e.MessageIds, o.ids...)
		}
	}
	var reqs []*txmqv1.SubscribeRequest
	for _, e := range extendOrder {
		reqs = append(reqs, &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Extend{Extend: e}})
	}
	for _, n := range nackOrder {
		reqs = append(reqs, &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: n}})
	}
	if len(acks) > 0 {
		reqs = append(reqs, &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: acks}}})
	}
	return reqs
}

func toDelivery(d *txmqv1.Delivery, group string) *Delivery {
	out := &Delivery{
		MessageID:     d.GetMessageId(),
		Topic:         d.GetTopic(),
		Group:         group,
		Key:           d.GetKey(),
		OrderingKey:   d.GetOrderingKey(),
		Properties:    d.GetProperties(),
		Body:          d.GetBody(),
		Attempt:       d.GetAttempt(),
		LastError:     d.GetLastError(),
		Sequence:      d.GetSequence(),
		ProducerGroup: d.GetProducerGroup(),
		TransactionID: d.GetTransactionId(),
	}
	// AsTime of a missing timestamp is 1970, not the zero time.
	if ts := d.GetCommittedAt(); ts != nil {
		out.CommittedAt = ts.AsTime()
	}
	if ts := d.GetAckDeadline(); ts != nil {
		out.AckDeadline = ts.AsTime()
	}
	return out
}
