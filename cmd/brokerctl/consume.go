package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// consumeMaxInFlight is the broker's default window. consume asks for a
// smaller one when --count is smaller, so that it does not pull deliveries it
// will neither print nor ack.
const consumeMaxInFlight = 64

// nackError is the error consume --nack gives with each nack, which the
// broker keeps as the message's last error.
const nackError = "nacked by brokerctl consume --nack"

// termError is the error consume --term gives with each terminate, which
// the dead letter keeps as its last error.
const termError = "terminated by brokerctl consume --term"

// maxNackDelay is the longest delay a NackRequest may ask for.
const maxNackDelay = 12 * time.Hour

func runConsume(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	group := fs.String("group", "", "consumer `group` (required, unless --peek)")
	count := fs.Uint("count", 0, "exit after `N` messages; 0: no limit")
	wait := fs.Duration("wait", 5*time.Second, "exit when no message arrived for this long")
	start := startFlag{text: "earliest", position: txmqv1.StartPosition_START_POSITION_EARLIEST}
	fs.Var(&start, "start", "where a new consumer group (or --peek) starts: earliest, latest, or a `time`, RFC 3339 (2026-05-01T10:00:00Z) or back from now (-1h)")
	fs.Var(&start, "from", "the same as --start, a start `position`")
	nack := fs.Bool("nack", false, "nack each message after printing it instead of acking it, for drills: the group redelivers it after its backoff, and moves it to its dead-letter queue once its deliveries are used up")
	nackDelay := fs.Duration("nack-delay", 0, "with --nack: redeliver after this long, 0s to 12h (default: the group's redelivery backoff)")
	term := fs.Bool("term", false, "terminate each message after printing it instead of acking it: it moves to the group's dead-letter queue at once, whatever deliveries it has left (to clear poison messages)")
	peekOnly := fs.Bool("peek", false, "print the messages from --start on without a consumer group and without acking: no group is created, nothing changes")
	pos, err := c.start(fs, args, "TOPIC")
	if err != nil {
		return err
	}
	switch {
	case *peekOnly && (*group != "" || *nack || *term || flagGiven(fs, "nack-delay")):
		return c.usageError(fs, "--peek reads without a consumer group and settles nothing: drop --group, --nack, --term and --nack-delay")
	case *wait <= 0:
		return c.usageError(fs, "--wait must be positive")
	case *peekOnly:
		return peek(ctx, c, pos[0], start, *count, *wait)
	case *group == "":
		return c.usageError(fs, "--group is required (or --peek, to read without a group)")
	case flagGiven(fs, "nack-delay") && !*nack:
		return c.usageError(fs, "--nack-delay goes with --nack")
	case *term && *nack:
		return c.usageError(fs, "--term and --nack exclude each other")
	case *nackDelay < 0 || *nackDelay > maxNackDelay:
		return c.usageError(fs, "--nack-delay must be between 0s and %s, not %s", maxNackDelay, *nackDelay)
	}
	s := &consumer{
		c: c,
		start: &txmqv1.SubscriptionStart{
			Topic:         pos[0],
			ConsumerGroup: *group,
			StartPosition: start.position,
			StartTime:     start.time,
		},
		unconfirmed: map[string]bool{},
	}
	if *nack {
		s.nack = &txmqv1.NackRequest{Error: nackError}
		if flagGiven(fs, "nack-delay") {
			s.nack.Delay = durationpb.New(*nackDelay)
		}
	}
	if *term {
		s.nack = &txmqv1.NackRequest{Error: termError, Terminate: true}
	}
	defer s.close()
	if err := s.subscribe(ctx, *count); err != nil {
		if ctx.Err() != nil {
			return nil // interrupted before the broker accepted the subscription
		}
		return err
	}
	if err := s.deliver(ctx, *count, *wait); err != nil {
		return err
	}
	if err := s.awaitConfirms(); err != nil {
		return err
	}
	return s.awaitEnd()
}

// consumer is brokerctl consume: one subscription at a time, a new one on
// another node when the broker's stream ends with Unavailable.
type consumer struct {
	c *cli
	// start is the subscription; MaxInFlight is set for each stream.
	start *txmqv1.SubscriptionStart
	// sub is the current subscription, nil when there is none.
	sub *subStream
	// unconfirmed holds the IDs acked on sub but not yet confirmed as
	// durably acked.
	unconfirmed map[string]bool
	// nack, when set, is what each delivery gets instead of an ack, with
	// the delivery's ID added (--nack or --term).
	nack *txmqv1.NackRequest
}

// subStream is one Subscribe stream, accepted by the node at addr.
type subStream struct {
	addr      string
	stream    grpc.BidiStreamingClient[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]
	responses chan received
	cancel    context.CancelFunc
	receiving chan struct{}
}

type received struct {
	resp *txmqv1.SubscribeResponse
	err  error
}

// window is how many unacked deliveries a stream asks for when remaining
// more are to be printed (0: no limit).
func window(remaining uint) uint32 {
	if remaining == 0 {
		return consumeMaxInFlight
	}
	return uint32(min(consumeMaxInFlight, remaining))
}

// subscribe subscribes on the leader, as unary calls find it, bounded by
// --timeout.
func (s *consumer) subscribe(ctx context.Context, remaining uint) error {
	s.start.MaxInFlight = window(remaining)
	ctx, cancel := context.WithTimeout(ctx, s.c.timeout)
	defer cancel()
	return s.c.invoke(ctx, toLeader, s.open)
}

// resubscribe replaces a stream that ended with the Unavailable cause,
// usually because its node lost the leadership. It subscribes again, to
// the leader cause names if any, else as unary calls find the leader,
// retrying with backoff while there is none (right after a leader change)
// until --timeout. It returns nil when ctx ends first.
func (s *consumer) resubscribe(ctx context.Context, cause error, remaining uint) error {
	addr := s.sub.addr
	s.close()
	// The acks the old stream did not confirm may not be durable: the
	// broker delivers those messages again, and they are printed again.
	// Nacks sent on it have no confirmation to wait for.
	clear(s.unconfirmed)
	s.c.conn.Follow(addr, cause)
	err := s.subscribe(ctx, remaining)
	switch {
	case ctx.Err() != nil:
		return nil
	case err != nil:
		return err
	}
	fmt.Fprintf(s.c.stderr, "brokerctl: the stream ended (%s: %s); subscribed again on %s\n",
		status.Code(cause), status.Convert(cause).Message(), s.sub.addr)
	return nil
}

// open is a txmq.Call: it opens a stream on cc, subscribes and waits until
// the broker accepted the subscription or ctx ends. On success the stream
// becomes s.sub.
func (s *consumer) open(ctx context.Context, addr string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
	// The stream outlives an interrupt of ctx long enough to collect the ack
	// confirmations for the messages printed already; until the broker
	// accepted the subscription, ctx bounds it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, cancel)
	stream, err := txmqv1.NewConsumerServiceClient(cc).Subscribe(sctx, opts...)
	if err != nil {
		stop()
		cancel()
		return s.notAccepted(ctx, err)
	}
	sub := &subStream{addr: addr, stream: stream, responses: make(chan received), cancel: cancel, receiving: make(chan struct{})}
	go func() {
		defer close(sub.receiving)
		sub.receive(sctx)
	}()
	err = sub.send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: s.start}})
	if err == nil {
		err = sub.subscribed(ctx)
	}
	if stop() && err == nil {
		s.sub = sub
		return nil
	}
	sub.close()
	return s.notAccepted(ctx, err)
}

// notAccepted is the error of a subscription attempt that failed with err,
// or that ctx ended.
func (s *consumer) notAccepted(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.Errorf(codes.DeadlineExceeded, "the broker did not accept the subscription within %s", s.c.timeout)
	}
	return err
}

// close ends the current stream, if any.
func (s *consumer) close() {
	if s.sub != nil {
		s.sub.close()
		s.sub = nil
	}
}

func (sub *subStream) close() {
	sub.cancel()
	<-sub.receiving
}

// receive passes what the stream receives to sub.responses, until the
// stream fails or ctx ends.
func (sub *subStream) receive(ctx context.Context) {
	for {
		resp, err := sub.stream.Recv()
		select {
		case sub.responses <- received{resp, err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// send sends req. When the stream has ended, Send returns io.EOF and the
// reason arrives through receive, so that is not an error here.
func (sub *subStream) send(req *txmqv1.SubscribeRequest) error {
	if err := sub.stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// subscribed waits until the broker accepted the subscription or ctx
// ends, so that --wait measures only the wait for messages.
func (sub *subStream) subscribed(ctx context.Context) error {
	for {
		select {
		case r := <-sub.responses:
			switch {
			case errors.Is(r.err, io.EOF):
				return status.Error(codes.Unavailable, "the broker ended the stream without accepting the subscription")
			case r.err != nil:
				return r.err
			case r.resp.GetSubscribed() != nil:
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// deliver prints each delivery and then acks it, until count were printed
// (when count > 0), no delivery arrived for wait, or ctx ends. When the
// stream ends with Unavailable it subscribes again and goes on; the wait
// keeps counting from the last delivery.
func (s *consumer) deliver(ctx context.Context, count uint, wait time.Duration) error {
	idle := time.NewTimer(wait)
	for n := uint(0); count == 0 || n < count; {
		select {
		case r := <-s.sub.responses:
			if status.Code(r.err) == codes.Unavailable {
				remaining := uint(0)
				if count > 0 {
					remaining = count - n
				}
				if err := s.resubscribe(ctx, r.err, remaining); err != nil || ctx.Err() != nil {
					return err
				}
				continue
			}
			if r.err != nil {
				return s.ended(r.err)
			}
			switch kind := r.resp.GetKind().(type) {
			case *txmqv1.SubscribeResponse_Delivery:
				if err := s.print(kind.Delivery); err != nil {
					return err
				}
				if err := s.settle(kind.Delivery.GetMessageId()); err != nil {
					return err
				}
				n++
				idle.Reset(wait)
			case *txmqv1.SubscribeResponse_AckConfirm:
				s.confirmed(kind.AckConfirm)
			}
		case <-idle.C:
			return nil
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

func (s *consumer) print(d *txmqv1.Delivery) error {
	if s.c.jsonOutput() {
		return s.c.printJSON(newDeliveryJSON(d))
	}
	line := fmt.Sprintf("%s  attempt=%d  key=%s", d.GetMessageId(), d.GetAttempt(), d.GetKey())
	if k := d.GetOrderingKey(); k != "" {
		line += "  ordering-key=" + k
	}
	if e := d.GetLastError(); e != "" {
		line += "  last-error=" + strconv.Quote(e)
	}
	_, err := fmt.Fprintf(s.c.stdout, "%s  %s\n", line, lineBody(d.GetBody()))
	return err
}

// settle acks the delivery id, or nacks it with --nack.
func (s *consumer) settle(id string) error {
	if s.nack != nil {
		nack := proto.CloneOf(s.nack)
		nack.MessageIds = []string{id}
		return s.sub.send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: nack}})
	}
	s.unconfirmed[id] = true
	return s.sub.send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: []string{id}}}})
}

func (s *consumer) confirmed(ac *txmqv1.AckConfirm) {
	for _, id := range ac.GetMessageIds() {
		delete(s.unconfirmed, id)
	}
}

// awaitConfirms waits, bounded by --timeout, until every ack sent is
// confirmed, so that the messages printed are not delivered again.
func (s *consumer) awaitConfirms() error {
	if len(s.unconfirmed) == 0 {
		return nil
	}
	deadline := time.NewTimer(s.c.timeout)
	for len(s.unconfirmed) > 0 {
		select {
		case r := <-s.sub.responses:
			if r.err != nil {
				return s.ended(r.err)
			}
			// Deliveries arriving now are neither printed nor acked: the
			// broker delivers them again.
			s.confirmed(r.resp.GetAckConfirm())
		case <-deadline.C:
			return status.Errorf(codes.DeadlineExceeded, "the broker did not confirm %d ack(s) within %s; those messages may be delivered again", len(s.unconfirmed), s.c.timeout)
		}
	}
	return nil
}

// awaitEnd closes the sending side of the stream and waits, bounded by
// --timeout, until the broker ends it. The broker confirms no nack; reading
// to the end of the stream is what makes sure it read the nacks, so that
// they are not cut off when consume exits. A stream closed this way also
// hands back the deliveries consume did not print without counting a
// failed attempt for them.
func (s *consumer) awaitEnd() error {
	if s.sub == nil {
		return nil
	}
	if err := s.sub.stream.CloseSend(); err != nil {
		return err
	}
	deadline := time.NewTimer(s.c.timeout)
	for {
		select {
		case r := <-s.sub.responses:
			// Deliveries arriving now are neither printed nor nacked: the
			// broker delivers them again once the stream has ended.
			if errors.Is(r.err, io.EOF) {
				return nil
			}
			if r.err != nil {
				return r.err
			}
		case <-deadline.C:
			return status.Errorf(codes.DeadlineExceeded, "the broker did not end the stream within %s; the last nacks may be lost, and those messages are redelivered once their ack deadline passes", s.c.timeout)
		}
	}
}

// ended maps the end of the stream to the error to report: none when the
// broker closed it with every ack confirmed.
func (s *consumer) ended(err error) error {
	s.close()
	switch {
	case !errors.Is(err, io.EOF):
		return err
	case len(s.unconfirmed) > 0:
		return status.Errorf(codes.Unavailable, "the broker ended the stream before confirming %d ack(s); those messages may be delivered again", len(s.unconfirmed))
	default:
		return nil
	}
}
