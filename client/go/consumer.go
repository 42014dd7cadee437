package txmq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

const (
	defaultMaxInFlight      = 64
	defaultReconnectBackoff = 2 * time.Second
	reconnectBaseDelay      = 50 * time.Millisecond
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
	// MaxInFlight bounds the deliveries the broker pushes without an ack.
	// Default 64.
	MaxInFlight int
	// Concurrency is how many handlers run in parallel. Default 1.
	Concurrency int
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
	pool *pool

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
	switch {
	case cfg.MaxInFlight < 0 || cfg.MaxInFlight > math.MaxUint32:
		return nil, invalidf("MaxInFlight %d is out of range", cfg.MaxInFlight)
	case cfg.MaxInFlight == 0:
		cfg.MaxInFlight = defaultMaxInFlight
	}
	switch {
	case cfg.Concurrency < 0:
		return nil, invalidf("Concurrency %d is negative", cfg.Concurrency)
	case cfg.Concurrency == 0:
		cfg.Concurrency = 1
	}
	switch {
	case cfg.ReconnectBackoff < 0:
		return nil, invalidf("ReconnectBackoff %v is negative", cfg.ReconnectBackoff)
	case cfg.ReconnectBackoff == 0:
		cfg.ReconnectBackoff = defaultReconnectBackoff
	}
	addrs, opts, logger, err := dialDefaults(cfg.Addrs, cfg.DialOptions, cfg.Logger)
	if err != nil {
		return nil, err
	}
	logger = logger.With("component", "txmq-consumer", "topic", cfg.Topic, "group", cfg.Group)
	return &Consumer{
		cfg:     cfg,
		log:     logger,
		pool:    newPool(addrs, opts, logger),
		closing: make(chan struct{}),
	}, nil
}

// Delivery is one delivery of a committed message.
type Delivery struct {
	// MessageID is the same on every delivery of the message: deduplicate
	// on it.
	MessageID string
	Topic     string
	Key       string
	// Properties and Body belong to the handler; the consumer does not
	// reuse them.
	Properties map[string]string
	Body       []byte
	// Attempt is 1 on the first delivery, then 2, 3, ... on redeliveries.
	Attempt     uint32
	CommittedAt time.Time
	// Sequence is the message's position in its topic.
	Sequence uint64
	// ProducerGroup and TransactionID are set for messages that were half
	// messages.
	ProducerGroup string
	TransactionID string
}

// Handler processes one delivery. Returning nil acks it. Returning an error
// leaves it unacked, and the broker delivers it again after its ack deadline
// (30 s by default), until it moves to the group's dead-letter queue.
type Handler func(ctx context.Context, d *Delivery) error

// errRunning is returned by a Run that overlaps another one on the same
// Consumer.
var errRunning = errors.New("txmq: consumer is already running")

// Run subscribes and passes each delivery to h, at most Concurrency at once,
// acking those h accepts. When the stream breaks (broker restart, leader
// change) it resubscribes with backoff, following the leader; the broker
// redelivers what was not acked.
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
	return c.pool.close()
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
	redirected := false
	for {
		addr, cc, err := r.c.pool.pick()
		if err != nil {
			return err
		}
		subscribed, err := r.session(addr, cc)
		if r.ctx.Err() != nil {
			return nil
		}
		if permanent(err) {
			return fromStatus(err)
		}
		if subscribed {
			delay = base
		}
		leader, _ := notLeader(status.Convert(err))
		r.c.pool.failover(addr, leader)

		wait := delay/2 + rand.N(delay/2+1)
		delay = min(2*delay, r.c.cfg.ReconnectBackoff)
		// As in pool.invoke: go straight to a newly named leader, but not
		// twice in a row.
		if leader != "" && leader != addr && !redirected {
			wait = 0
			redirected = true
		} else {
			redirected = false
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

// session runs one Subscribe stream until it breaks or r.ctx ends, and says
// whether the broker confirmed the subscription.
func (r *run) session(addr string, cc grpc.ClientConnInterface) (subscribed bool, err error) {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	stream, err := txmqv1.NewConsumerServiceClient(cc).Subscribe(ctx)
	if err != nil {
		return false, err
	}
	start := &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
		Topic:         r.c.cfg.Topic,
		ConsumerGroup: r.c.cfg.Group,
		StartPosition: startPositions[r.c.cfg.Start],
		MaxInFlight:   uint32(r.c.cfg.MaxInFlight),
	}}}
	// A failed Send only says the stream is gone; Recv tells why.
	if err := stream.Send(start); err != nil {
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

	// acks is this stream's alone: acks of handlers that outlive it are
	// dropped, since the broker redelivers what it did not see acked. With a
	// slot per concurrent handler, handlers rarely wait for the sender.
	acks := make(chan string, r.c.cfg.Concurrency)
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		r.sendAcks(ctx, stream, acks)
		// A failed send means the stream is gone. End the session now:
		// otherwise handlers wait for room in acks that nobody drains, and
		// this loop waits for a handler slot instead of reading the
		// stream's end.
		cancel()
	}()
	defer func() {
		cancel()
		<-senderDone
	}()

	for {
		resp, err := stream.Recv()
		if err != nil {
			return true, err
		}
		switch kind := resp.GetKind().(type) {
		case *txmqv1.SubscribeResponse_Delivery:
			select {
			case r.sem <- struct{}{}:
			case <-ctx.Done():
				if r.ctx.Err() != nil {
					return true, r.ctx.Err()
				}
				return true, fmt.Errorf("txmq: subscription to %s ended while sending acks", addr)
			}
			d := toDelivery(kind.Delivery)
			r.handlers.Go(func() { r.handle(ctx, acks, d) })
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

// handle runs the handler for d and queues its ack on the stream that
// delivered it, unless that stream has ended.
func (r *run) handle(stream context.Context, acks chan<- string, d *Delivery) {
	defer func() { <-r.sem }()
	log := r.c.log.With("msg_id", d.MessageID, "attempt", d.Attempt)
	if err := r.h(r.ctx, d); err != nil {
		log.Warn("handler failed; the broker redelivers after the ack deadline", "err", err)
		return
	}
	select {
	case acks <- d.MessageID:
	case <-stream.Done():
		log.Debug("subscription ended before the ack; the broker will redeliver")
	}
}

// sendAcks sends queued acks on stream, batching those already waiting, until
// ctx ends or the stream fails. It is the stream's only sender after the
// SubscriptionStart, as gRPC requires.
func (r *run) sendAcks(ctx context.Context, stream grpc.BidiStreamingClient[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse], acks <-chan string) {
	for {
		var batch []string
		select {
		case <-ctx.Done():
			return
		case id := <-acks:
			batch = append(batch, id)
		}
	fill:
		for {
			select {
			case id := <-acks:
				batch = append(batch, id)
			default:
				break fill
			}
		}
		req := &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: batch}}}
		// On failure the stream is finished and its Recv returns the
		// reason, which ends the session.
		if err := stream.Send(req); err != nil {
			r.c.log.Debug("ack not sent; the broker will redeliver", "count", len(batch), "err", err)
			return
		}
	}
}

func toDelivery(d *txmqv1.Delivery) *Delivery {
	out := &Delivery{
		MessageID:     d.GetMessageId(),
		Topic:         d.GetTopic(),
		Key:           d.GetKey(),
		Properties:    d.GetProperties(),
		Body:          d.GetBody(),
		Attempt:       d.GetAttempt(),
		Sequence:      d.GetSequence(),
		ProducerGroup: d.GetProducerGroup(),
		TransactionID: d.GetTransactionId(),
	}
	// AsTime of a missing timestamp is 1970, not the zero time.
	if ts := d.GetCommittedAt(); ts != nil {
		out.CommittedAt = ts.AsTime()
	}
	return out
}
