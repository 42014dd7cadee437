package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/bounds"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type consumerService struct {
	txmqv1.UnimplementedConsumerServiceServer
	b *Broker
}

// ackTimeout bounds the replication of acks. Acks are replicated on their
// own context so that acks a client sent just before closing its stream
// still count.
const ackTimeout = 10 * time.Second

// maxClientID bounds a subscriber's client ID.
const maxClientID = 256

func (s *consumerService) Subscribe(stream txmqv1.ConsumerService_SubscribeServer) error {
	b := s.b
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start, maxInFlight, err := b.checkStart(first)
	if err != nil {
		return err
	}
	created, g, err := b.ensureGroup(ctx, start)
	if err != nil {
		return err
	}
	d, err := b.dispatcherFor(ctx, groupKey{start.Topic, start.ConsumerGroup})
	if err != nil {
		return err
	}
	sub := newSubscriber(maxInFlight)
	sub.clientID, sub.addr, sub.since = start.ClientId, streamPeer(ctx), b.clock.Now()
	ss := &session{
		stream:  stream,
		d:       d,
		sub:     sub,
		log:     d.log.With("subscriber", streamPeer(ctx), "client_id", start.ClientId),
		acks:    make(chan []string, 64),
		recvErr: make(chan error, 1),
		quit:    make(chan struct{}),
	}
	if err := d.add(ss.sub); err != nil {
		return err
	}
	// A client that closes its side of the stream hands back what it has
	// not settled; a stream that breaks is a failed attempt for each.
	closedByClient := false
	defer func() { d.remove(ss.sub, closedByClient) }()
	ss.log.Debug("subscribed", "max_in_flight", maxInFlight, "created", created)
	if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{
		Topic: start.Topic, ConsumerGroup: start.ConsumerGroup, Created: created, AckedThrough: g.AckedThrough,
	}}}); err != nil {
		return err
	}
	// Neither goroutine is waited for: the receiver is blocked in Recv
	// until the stream ends, which happens only once this handler returns.
	defer close(ss.quit)
	go ss.receive()
	go ss.replicateAcks()
	closedByClient, err = ss.send(ctx)
	return err
}

// checkStart checks the first message of a Subscribe stream and returns
// the subscription and its in-flight window.
func (b *Broker) checkStart(first *txmqv1.SubscribeRequest) (*txmqv1.SubscriptionStart, int, error) {
	start := first.GetStart()
	if start == nil {
		return nil, 0, invalidf("the first message of Subscribe must be a SubscriptionStart")
	}
	if err := checkTopic(start.Topic); err != nil {
		return nil, 0, err
	}
	if err := checkName("consumer_group", start.ConsumerGroup); err != nil {
		return nil, 0, err
	}
	if len(start.ClientId) > maxClientID {
		return nil, 0, invalidf("client_id is %d bytes, over the limit of %d", len(start.ClientId), maxClientID)
	}
	maxInFlight := int(start.MaxInFlight)
	switch {
	case maxInFlight == 0:
		maxInFlight = b.cfg.MaxInFlight
	case maxInFlight > b.cfg.MaxInFlightLimit:
		return nil, 0, invalidf("max_in_flight is over the limit of %d", b.cfg.MaxInFlightLimit)
	}
	return start, maxInFlight, nil
}

// session is one Subscribe stream attached to its group's dispatcher: the
// receiver takes acks, nacks and extensions off the stream, the acker
// replicates acks (coalescing what arrives meanwhile into one proposal),
// and send pushes deliveries and confirmations.
type session struct {
	stream  txmqv1.ConsumerService_SubscribeServer
	d       *dispatcher
	sub     *subscriber
	log     *slog.Logger
	acks    chan []string
	recvErr chan error
	quit    chan struct{}
}

func (ss *session) receive() {
	defer close(ss.acks)
	for {
		req, err := ss.stream.Recv()
		if err != nil {
			ss.recvErr <- err
			return
		}
		switch k := req.Kind.(type) {
		case *txmqv1.SubscribeRequest_Ack:
			select {
			case ss.acks <- k.Ack.MessageIds:
			case <-ss.quit:
				return
			}
		case *txmqv1.SubscribeRequest_Nack:
			delay, err := optDuration("nack delay", k.Nack.Delay, bounds.RedeliveryStep)
			if err == nil && k.Nack.Terminate && delay != nil {
				err = invalidf("a terminating nack takes no delay: its messages go to the dead-letter queue at once")
			}
			if err != nil {
				ss.recvErr <- err
				return
			}
			ss.d.nack(k.Nack.MessageIds, delay, k.Nack.Error, k.Nack.Terminate)
		case *txmqv1.SubscribeRequest_Extend:
			ext, err := optDuration("deadline extension", k.Extend.Extension, bounds.Extension)
			if err != nil {
				ss.recvErr <- err
				return
			}
			ss.d.extend(k.Extend.MessageIds, ext)
		default:
			ss.recvErr <- invalidf("after the SubscriptionStart only acks, nacks and extensions may be sent")
			return
		}
	}
}

func (ss *session) replicateAcks() {
	for ids := range ss.acks {
	drain:
		for {
			select {
			case more, ok := <-ss.acks:
				if !ok {
					break drain
				}
				ids = append(ids, more...)
			default:
				break drain
			}
		}
		actx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		done, err := ss.d.ack(actx, ids)
		cancel()
		if err != nil {
			ss.log.Warn("acks not replicated; the messages will be redelivered", "err", err, "count", len(ids))
			ss.sub.end(err)
			return
		}
		if len(done) > 0 {
			ss.sub.push(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_AckConfirm{
				AckConfirm: &txmqv1.AckConfirm{MessageIds: done},
			}})
		}
	}
}

// send pushes what the dispatcher queues for the subscriber until the
// stream ends; closedByClient tells a clean half-close from a break.
func (ss *session) send(ctx context.Context) (closedByClient bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case err := <-ss.recvErr:
			if errors.Is(err, io.EOF) {
				return true, nil
			}
			if _, ok := status.FromError(err); ok || errors.Is(err, errInvalidArgument) {
				return false, err
			}
			return false, fmt.Errorf("%w: %w", errStreamBroken, err)
		case <-ss.sub.signal:
		}
		out, err := ss.sub.take()
		if err != nil {
			return false, err
		}
		for _, r := range out {
			if err := ss.stream.Send(r); err != nil {
				return false, err
			}
		}
	}
}

// optDuration checks an optional duration; nil when unset.
func optDuration(what string, d *durationpb.Duration, r bounds.Range[time.Duration]) (*time.Duration, error) {
	if d == nil {
		return nil, nil
	}
	if err := d.CheckValid(); err != nil {
		return nil, invalidf("%s: %v", what, err)
	}
	v := d.AsDuration()
	if err := r.Check(what, v); err != nil {
		return nil, invalidf("%v", err)
	}
	return &v, nil
}

// optNanos is optDuration as a command carries it: nanoseconds, nil when
// unset.
func optNanos(what string, d *durationpb.Duration, r bounds.Range[time.Duration]) (*int64, error) {
	v, err := optDuration(what, d, r)
	if v == nil || err != nil {
		return nil, err
	}
	ns := int64(*v)
	return &ns, nil
}

// ensureGroup makes sure the topic and the group exist, creating what is
// missing when auto-create is on (the group marked as auto-created) and
// refusing with NotFound otherwise, proposing only what is missing: a reconnect of an existing
// group's subscriber writes nothing. Creation is idempotent, so a race
// with another subscriber creating the same group is harmless.
func (b *Broker) ensureGroup(ctx context.Context, start *txmqv1.SubscriptionStart) (bool, *storepb.Group, error) {
	earliest := raftpb.StartPosition_START_POSITION_EARLIEST
	pos, at, err := startPosition("start_position", start.StartPosition, start.StartTime, &earliest)
	if err != nil {
		return false, nil, err
	}
	var topicExists bool
	var g *storepb.Group
	err = b.node.Store().View(func(tx *halfstore.Tx) error {
		_, err := tx.Topic(start.Topic)
		if topicExists = err == nil; !topicExists {
			return err
		}
		g, err = tx.Group(start.Topic, start.ConsumerGroup)
		return err
	})
	switch {
	case err == nil:
		return false, g, nil
	case !errors.Is(err, halfstore.ErrNotFound):
		return false, nil, err
	case !topicExists && !*b.cfg.AutoCreateTopics:
		return false, nil, fmt.Errorf("%w: topic %q does not exist, and this broker does not create topics on subscription (--auto-create-topics=false); check the name, or create it: brokerctl topic create %s",
			halfstore.ErrNotFound, start.Topic, start.Topic)
	case !*b.cfg.AutoCreateTopics:
		return false, nil, fmt.Errorf("%w: consumer group %q does not exist on topic %q, and this broker does not create groups on subscription (--auto-create-topics=false); check the name, or create it: brokerctl group create %s --topic %s",
			halfstore.ErrNotFound, start.ConsumerGroup, start.Topic, start.ConsumerGroup, start.Topic)
	case !topicExists:
		if _, err := b.node.CreateTopic(ctx, b.clock.Now(), &raftpb.CreateTopic{Name: start.Topic}); err != nil {
			return false, nil, err
		}
	}
	r, err := b.node.CreateGroup(ctx, b.clock.Now(), &raftpb.CreateGroup{
		Topic: start.Topic, Group: start.ConsumerGroup, Start: pos, StartTime: at, AutoCreated: true,
	})
	if err != nil {
		return false, nil, err
	}
	if r.Created {
		b.log.Info("consumer group created", "topic", start.Topic, "group", start.ConsumerGroup,
			"start", start.StartPosition.String(), "acked_through", r.Group.AckedThrough)
	}
	return r.Created, r.Group, nil
}

func streamPeer(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok {
		return p.Addr.String()
	}
	return ""
}
