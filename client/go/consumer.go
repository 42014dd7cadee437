package txmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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
	// maxClientID is the broker's limit of SubscriptionStart.client_id.
	maxClientID = 256
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
	// DialOptions are passed to grpc.NewClient after the transport
	// credentials TLS sets (plaintext without TLS), so they can replace
	// them.
	DialOptions []grpc.DialOption
	// Token is the bearer token of the principal (ConnConfig.Token).
	Token string
	// TLS secures the connections to the brokers (ConnConfig.TLS).
	TLS *tls.Config
	// Logger receives the consumer's logs. Default slog.Default().
	Logger *slog.Logger
	// ReconnectBackoff caps the wait between attempts to resubscribe after
	// the stream broke. Default 2 s.
	ReconnectBackoff time.Duration
	// ClientID names this consumer to the broker, in brokerctl group
	// describe --members; at most 256 bytes. Default: hostname-pid-random.
	ClientID string
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
	switch {
	case len(cfg.ClientID) > maxClientID:
		return nil, invalidf("ClientID is %d bytes, over the limit of %d", len(cfg.ClientID), maxClientID)
	case cfg.ClientID == "":
		cfg.ClientID = defaultInstanceID()
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "txmq-consumer", "topic", cfg.Topic, "group", cfg.Group)
	conn, err := Dial(ConnConfig{Addrs: cfg.Addrs, DialOptions: cfg.DialOptions, TLS: cfg.TLS, Token: cfg.Token, Logger: logger})
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

// Term moves d to its group's dead-letter queue now, whatever attempts it
// has left, with reason as the dead letter's last error (NATS's Term): for
// a poison message that no retry will fix. With ordering keys the rest of
// d's key goes on, or waits for an operator, as after any dead letter. It
// returns once the request is sent on the stream that delivered d; what
// the handler returns afterwards is not sent. It fails when d was already
// acked, nacked or terminated, and when that stream has ended or ctx ends
// before the request is sent (the broker then delivers d again, once its
// ack deadline passes). Returning Terminate(err) from the handler does the
// same when the handler returns.
func (d *Delivery) Term(ctx context.Context, reason string) error {
	if d.t == nil {
		return invalidf("delivery %s did not come from a Consumer", d.MessageID)
	}
	return d.t.s.term(ctx, d.t, reason)
}

// Handler processes one delivery. Returning nil acks it. Returning an error
// nacks it with the error's text, and the broker delivers it again after the
// group's redelivery backoff for its attempt; return RetryAfter(err, delay)
// to choose the delay, or Terminate(err) to dead-letter it at once. A
// delivery that used the group's max_deliveries goes to the group's
// dead-letter queue instead.
type Handler func(ctx context.Context, d *Delivery) error

// Terminate wraps err so that a Handler returning it (or an error wrapping
// it) has its delivery moved to the group's dead-letter queue at once,
// whatever attempts are left, with err's text as the dead letter's last
// error: for a poison message that no retry will fix (NATS's Term). It
// wins over RetryAfter when an error wraps both. err may be nil.
func Terminate(err error) error {
	return &terminateError{err: err}
}

type terminateError struct{ err error }

func (e *terminateError) Error() string {
	if e.err == nil {
		return "terminated by the consumer"
	}
	return e.err.Error()
}

func (e *terminateError) Unwrap() error { return e.err }

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
