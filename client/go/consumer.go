package txmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

const (
	defaultPrefetch         = 64
	maxPrefetch             = 10000
	defaultMaxExtension     = time.Hour
	defaultReconnectBackoff = 2 * time.Second
	reconnectBaseDelay      = 50 * time.Millisecond

	// The broker's ranges for NackRequest.delay and ExtendRequest.extension.
	maxNackDelay = 12 * time.Hour
	minExtension = time.Second
	maxExtension = 12 * time.Hour
	// maxErrorText bounds the handler error text sent with a nack: it is
	// kept with the message as its last error, not a log.
	maxErrorText = 1024
)

// StartPosition is where a consumer group that does not exist yet starts
// reading its topic. An existing group always continues from its own
// progress.
type StartPosition int

const (
	// StartEarliest starts a new group at the oldest retained message.
	StartEarliest StartPosition = iota
	// StartLatest starts a new group after the newest message: it only
	// receives messages committed from then on.
	StartLatest
)

// ConsumerConfig configures a Consumer. Topic and Group are required; every
// other field has a usable default.
type ConsumerConfig struct {
	// Addrs are broker gRPC addresses (host:port). Default 127.0.0.1:7420.
	Addrs []string
	// Topic to consume.
	Topic string
	// Group is the consumer group. Every group gets every message of the
	// topic; the members of one group share them.
	Group string
	// Start applies only when Group does not exist yet on Topic.
	Start StartPosition
	// StartAt, when set, starts a group that does not exist yet at the
	// first message committed at or after this time, instead of Start
	// (which must then be StartEarliest, the zero value).
	StartAt time.Time
	// Prefetch is the broker-side flow-control window: how many deliveries
	// the broker pushes to this consumer without an ack (or nack). Default
	// 64, at most 10000. Deliveries beyond Concurrency wait in the client
	// for a free handler; their ack deadline is extended while they wait,
	// as for running ones, so keep Prefetch near what Concurrency handlers
	// get through in an ack deadline, or other members of the group go
	// without while this one sits on messages.
	Prefetch int
	// Concurrency is how many handlers run in parallel. Default 1.
	Concurrency int
	// MaxExtension bounds how long the consumer keeps extending the ack
	// deadline of a delivery that is waiting for or running its handler,
	// counted from its arrival. After that the consumer stops extending
	// it, and the broker redelivers it when its deadline passes, at most
	// one ack deadline later: a stuck handler does not hold a message for
	// ever. Default 1 h; negative: no automatic extension. Delivery.Extend
	// is not bound by it.
	MaxExtension time.Duration
	// DialOptions are passed to grpc.NewClient. Default: insecure
	// (plaintext) transport credentials.
	DialOptions []grpc.DialOption
	// Logger receives the consumer's logs. Default slog.Default().
	Logger *slog.Logger
	// ReconnectBackoff caps the wait between attempts to resubscribe after
	// the stream broke. Default 2 s.
	ReconnectBackoff time.Duration
}

// Consumer receives the committed messages of one topic for one consumer
// group. Delivery is at least once: a message whose handler failed, or whose
// ack was lost with its stream, comes again with a higher Attempt and the same
// MessageID, so handlers must be idempotent (deduplicate on MessageID).
type Consumer struct {
	cfg  ConsumerConfig
	log  *slog.Logger
	conn *Conn

	running   atomic.Bool
	closeOnce sync.Once
	closing   chan struct{}
}

// NewConsumer checks cfg and returns a Consumer. It does not connect: Run
// does.
func NewConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := checkName("Topic", cfg.Topic); err != nil {
		return nil, err
	}
	if err := checkName("Group", cfg.Group); err != nil {
		return nil, err
	}
	if cfg.Start != StartEarliest && cfg.Start != StartLatest {
		return nil, invalidf("Start %d is neither StartEarliest nor StartLatest", cfg.Start)
	}
	if !cfg.StartAt.IsZero() && cfg.Start != StartEarliest {
		return nil, invalidf("StartAt and Start StartLatest are both set; choose one")
	}
	switch {
	case cfg.Prefetch < 0 || cfg.Prefetch > maxPrefetch:
		return nil, invalidf("Prefetch %d is outside 0 to %d", cfg.Prefetch, maxPrefetch)
	case cfg.Prefetch == 0:
		cfg.Prefetch = defaultPrefetch
	}
	switch {
	case cfg.Concurrency < 0:
		return nil, invalidf("Concurrency %d is negative", cfg.Concurrency)
	case cfg.Concurrency == 0:
		cfg.Concurrency = 1
	}
	if cfg.MaxExtension == 0 {
		cfg.MaxExtension = defaultMaxExtension
	}
	switch {
	case cfg.ReconnectBackoff < 0:
		return nil, invalidf("ReconnectBackoff %v is negative", cfg.ReconnectBackoff)
	case cfg.ReconnectBackoff == 0:
		cfg.ReconnectBackoff = defaultReconnectBackoff
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "txmq-consumer", "topic", cfg.Topic, "group", cfg.Group)
	conn, err := Dial(ConnConfig{Addrs: cfg.Addrs, DialOptions: cfg.DialOptions, Logger: logger})
	if err != nil {
		return nil, err
	}
	return &Consumer{
		cfg:     cfg,
		log:     logger,
		conn:    conn,
		closing: make(chan struct{}),
	}, nil
}

// Delivery is one delivery of a committed message.
type Delivery struct {
	// MessageID is the same on every delivery of the message: deduplicate
	// on it.
	MessageID string
	Topic     string
	// Group is the consumer group the message was delivered to.
	Group string
	Key   string
	// OrderingKey is the producer's Message.OrderingKey: the group gets the
	// messages of one ordering key in commit order, one at a time.
	OrderingKey string
	// Properties and Body belong to the handler; the consumer does not
	// reuse them.
	Properties map[string]string
	Body       []byte
	// Attempt is 1 on the first delivery, then 2, 3, ... on redeliveries.
	Attempt uint32
	// LastError is the error text of the previous failed attempt, as its
	// handler returned it (see Handler); empty on a first delivery.
	LastError string
	// AckDeadline is when the broker redelivers the message unless it is
	// acked, nacked or extended, as the broker set it for this delivery.
	// The consumer extends it while the handler runs (see
	// ConsumerConfig.MaxExtension); it is zero when the broker did not say.
	AckDeadline time.Time
	CommittedAt time.Time
	// Sequence is the message's position in its topic.
	Sequence uint64
	// ProducerGroup and TransactionID are set for messages that were half
	// messages.
	ProducerGroup string
	TransactionID string

	// t is the consumer's bookkeeping for this delivery; nil for a
	// Delivery that did not come from a Consumer.
	t *tracked
}

// Extend asks the broker to push the ack deadline of d to extension from now
// (1 s to 12 h), for a handler that knows it needs longer than the group's
// ack deadline. The consumer extends running deliveries by itself (see
// ConsumerConfig.MaxExtension); Extend is for going further, and is not
// bound by MaxExtension. It returns once the request is sent on the stream
// that delivered d. It fails when d was already acked or nacked, and when
// that stream has ended: the broker then delivers the message again, and
// the handler may as well stop.
func (d *Delivery) Extend(ctx context.Context, extension time.Duration) error {
	if extension < minExtension || extension > maxExtension {
		return invalidf("extension %v is outside 1s to 12h", extension)
	}
	if d.t == nil {
		return invalidf("delivery %s did not come from a Consumer", d.MessageID)
	}
	return d.t.s.extend(ctx, d.t, extension)
}

// Handler processes one delivery. Returning nil acks it. Returning an error
// nacks it with the error's text, and the broker delivers it again after the
// group's redelivery backoff for its attempt; return RetryAfter(err, delay)
// to choose the delay. A delivery that used the group's max_deliveries goes
// to the group's dead-letter queue instead.
type Handler func(ctx context.Context, d *Delivery) error

// RetryAfter wraps err so that a Handler returning it (or an error wrapping
// it) has its delivery redelivered after delay instead of after the group's
// backoff. delay is clamped to the broker's range, 0 to 12 h; 0 redelivers
// at once. The nack carries err's text; err may be nil.
func RetryAfter(err error, delay time.Duration) error {
	return &retryError{err: err, delay: min(max(delay, 0), maxNackDelay)}
}

type retryError struct {
	err   error
	delay time.Duration
}

func (e *retryError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("retry after %v", e.delay)
	}
	return e.err.Error()
}

func (e *retryError) Unwrap() error { return e.err }

// errRunning is returned by a Run that overlaps another one on the same
// Consumer.
var errRunning = errors.New("txmq: consumer is already running")

// Run subscribes and passes each delivery to h, at most Concurrency at once,
// acking those h accepts and nacking the others (see Handler). While a
// delivery waits for or runs its handler, Run extends its ack deadline (see
// ConsumerConfig.MaxExtension). When the stream breaks (broker restart,
// leader change) it resubscribes with backoff, following the leader; the
// broker redelivers what was not acked.
//
// Run blocks until ctx is done and returns nil, or until the broker refuses
// the subscription for a reason retrying cannot fix (ErrInvalidArgument,
// ErrNotFound, ErrConflict, ErrPermissionDenied, ErrUnauthenticated, an
// unimplemented method) and returns that error, or until Close, and returns
// ErrClosed. In every case it returns only after every handler it started
// has returned; handlers get a context that ends when Run is stopping.
// Do not call Close from a handler and then wait for Run from it.
func (c *Consumer) Run(ctx context.Context, h Handler) error {
	if h == nil {
		return invalidf("handler is nil")
	}
	if !c.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer c.running.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	var watcher sync.WaitGroup
	watcher.Go(func() {
		select {
		case <-c.closing:
			cancel()
		case <-ctx.Done():
		}
	})

	r := &run{c: c, h: h, ctx: ctx, sem: make(chan struct{}, c.cfg.Concurrency)}
	err := r.loop()
	cancel()
	watcher.Wait()
	r.handlers.Wait()

	select {
	case <-c.closing:
		return ErrClosed
	default:
		return err
	}
}

// Close stops a running Run, which returns ErrClosed once its handlers have
// returned, and closes the consumer's connections.
func (c *Consumer) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	return c.conn.Close()
}

// run is the state of one Run call, shared by its subscriptions: handlers
// of a dead subscription count against Concurrency until they return.
type run struct {
	c        *Consumer
	h        Handler
	ctx      context.Context
	sem      chan struct{}
	handlers sync.WaitGroup
}

// loop subscribes again and again until ctx ends or the broker refuses for
// good. It returns nil when ctx ended.
func (r *run) loop() error {
	base := min(reconnectBaseDelay, r.c.cfg.ReconnectBackoff)
	delay := base
	streak := 0 // NotLeader redirects followed in a row
	for {
		addr, cc, err := r.c.conn.pick("")
		if err != nil {
			return err
		}
		subscribed, err := r.runSession(addr, cc)
		if r.ctx.Err() != nil {
			return nil
		}
		if permanent(err) {
			return fromStatus(err)
		}
		if subscribed {
			delay, streak = base, 0
		}
		leader, _ := notLeader(status.Convert(err))
		var wait time.Duration
		if !r.c.conn.redirect(addr, leader, &streak) {
			wait = delay/2 + rand.N(delay/2+1)
			delay = min(2*delay, r.c.cfg.ReconnectBackoff)
		}
		r.c.log.Warn("subscription ended; resubscribing", "addr", addr, "leader", leader, "wait", wait, "err", err)
		if sleep(r.ctx, wait) != nil {
			return nil
		}
	}
}

// permanent reports whether a broken subscription should end Run rather
// than be retried. A stream the broker closed cleanly (io.EOF), Unavailable,
// ResourceExhausted and transport errors are retried.
func permanent(err error) bool {
	if err == nil || errors.Is(err, io.EOF) {
		return false
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.PermissionDenied,
		codes.Unauthenticated, codes.Unimplemented, codes.AlreadyExists, codes.OutOfRange:
		return true
	}
	return false
}

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
func (r *run) runSession(addr string, cc grpc.ClientConnInterface) (subscribed bool, err error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	stream, err := txmqv1.NewConsumerServiceClient(cc).Subscribe(ctx)
	if err != nil {
		return false, err
	}
	start := &txmqv1.SubscriptionStart{
		Topic:         r.c.cfg.Topic,
		ConsumerGroup: r.c.cfg.Group,
		StartPosition: startPositions[r.c.cfg.Start],
		MaxInFlight:   uint32(r.c.cfg.Prefetch),
	}
	if !r.c.cfg.StartAt.IsZero() {
		start.StartPosition = txmqv1.StartPosition_START_POSITION_TIMESTAMP
		start.StartTime = timestamppb.New(r.c.cfg.StartAt)
	}
	// A failed Send only says the stream is gone; Recv tells why.
	if err := stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: start}}); err != nil {
		_, err = stream.Recv()
		return false, err
	}
	resp, err := stream.Recv()
	if err != nil {
		return false, err
	}
	sub := resp.GetSubscribed()
	if sub == nil {
		return false, fmt.Errorf("txmq: broker answered the subscription with %T, not Subscribed", resp.GetKind())
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
			r.c.log.Debug("acks durable", "count", len(kind.AckConfirm.GetMessageIds()))
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

// settle ends the bookkeeping of t, whose handler returned.
func (s *session) settle(t *tracked) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t.settled = true
	delete(s.pending, t)
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
	log := s.log.With("msg_id", d.MessageID, "attempt", d.Attempt)
	err := s.r.h(s.r.ctx, d)
	s.settle(t)
	o := outcome{kind: outcomeAck, ids: []string{d.MessageID}}
	if err != nil {
		o = nack(d.MessageID, err)
		if o.delay != nil {
			log.Warn("handler failed; nacked", "err", err, "retry_after", *o.delay)
		} else {
			log.Warn("handler failed; nacked, the broker redelivers after the group's backoff", "err", err)
		}
	}
	select {
	case s.out <- o:
	case <-s.ctx.Done():
		log.Debug("subscription ended before the outcome was sent; the broker will redeliver")
	}
}

// nack is the outcome for a handler that returned err.
func nack(id string, err error) outcome {
	o := outcome{kind: outcomeNack, ids: []string{id}, errText: truncateUTF8(err.Error(), maxErrorText)}
	if re, ok := errors.AsType[*retryError](err); ok {
		o.delay = &re.delay
	}
	return o
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

// extend sends an extension of t's deadline for Delivery.Extend.
func (s *session) extend(ctx context.Context, t *tracked, extension time.Duration) error {
	s.mu.Lock()
	if t.settled {
		s.mu.Unlock()
		return fmt.Errorf("txmq: delivery %s is already acked or nacked", t.d.MessageID)
	}
	now := time.Now()
	t.set, t.deadline = now, now.Add(extension)
	s.mu.Unlock()
	s.poke()

	o := outcome{kind: outcomeExtend, ids: []string{t.d.MessageID}, extension: &extension, done: make(chan error, 1)}
	lost := fmt.Errorf("txmq: the subscription that delivered %s ended; the broker will deliver it again", t.d.MessageID)
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

// extendLoop extends, in batches, the deadlines of the deliveries that are
// still pending, until the session ends. Each is extended when two thirds
// of its time left have passed, by the group's ack deadline, until it has
// been pending for MaxExtension; deliveries past half of their time go
// along with a batch.
func (s *session) extendLoop() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ids, next := s.dueExtensions(time.Now())
		if len(ids) > 0 {
			s.log.Debug("extending ack deadlines", "count", len(ids))
			select {
			case s.out <- outcome{kind: outcomeExtend, ids: ids}:
			case <-s.ctx.Done():
				return
			}
		}
		var due <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			due = timer.C
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-due:
		}
	}
}

// dueExtensions picks the deliveries to extend at now, counts them as
// extended, and says when the next one falls due (zero: none).
func (s *session) dueExtensions(now time.Time) (ids []string, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	limit := s.r.c.cfg.MaxExtension
	var due, early []*tracked
	for t := range s.pending {
		if t.window == 0 || now.Sub(t.arrived) >= limit {
			continue
		}
		span := t.deadline.Sub(t.set)
		switch {
		case !now.Before(t.set.Add(span * 2 / 3)):
			due = append(due, t)
		case !now.Before(t.set.Add(span / 2)):
			early = append(early, t)
		}
	}
	if len(due) > 0 {
		for _, t := range append(due, early...) {
			t.set, t.deadline = now, now.Add(t.window)
			ids = append(ids, t.d.MessageID)
		}
	}
	for t := range s.pending {
		if t.window == 0 || now.Sub(t.arrived) >= limit {
			continue
		}
		at := t.set.Add(t.deadline.Sub(t.set) * 2 / 3)
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return ids, next
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
		delay   time.Duration
		delayed bool
		errText string
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
			k := nackKey{errText: o.errText}
			if o.delay != nil {
				k.delay, k.delayed = *o.delay, true
			}
			n, ok := nacks[k]
			if !ok {
				n = &txmqv1.NackRequest{Error: o.errText}
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
