package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
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

func (s *consumerService) Subscribe(stream txmqv1.ConsumerService_SubscribeServer) error {
	b := s.b
	ctx := stream.Context()
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return invalidf("%s", "the first message of Subscribe must be a SubscriptionStart")
	}
	if err := checkTopic(start.Topic); err != nil {
		return err
	}
	if err := checkName("consumer_group", start.ConsumerGroup); err != nil {
		return err
	}
	maxInFlight := int(start.MaxInFlight)
	switch {
	case maxInFlight == 0:
		maxInFlight = b.cfg.MaxInFlight
	case maxInFlight > b.cfg.MaxInFlightLimit:
		return invalidf("max_in_flight is over the limit of %d", b.cfg.MaxInFlightLimit)
	}
	created, g, err := b.ensureGroup(ctx, start)
	if err != nil {
		return err
	}
	key := groupKey{start.Topic, start.ConsumerGroup}
	d, err := b.dispatcherFor(ctx, key)
	if err != nil {
		return err
	}
	sub := newSubscriber(maxInFlight)
	if err := d.add(sub); err != nil {
		return err
	}
	// A client that closes its side of the stream hands back what it has
	// not settled; a stream that breaks is a failed attempt for each.
	closedByClient := false
	defer func() { d.remove(sub, closedByClient) }()
	log := d.log.With("subscriber", streamPeer(ctx))
	log.Debug("subscribed", "max_in_flight", maxInFlight, "created", created)
	if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{
		Topic: start.Topic, ConsumerGroup: start.ConsumerGroup, Created: created, AckedThrough: g.AckedThrough,
	}}}); err != nil {
		return err
	}

	// The receiver takes acks off the stream; the acker replicates them,
	// coalescing what arrives meanwhile into one proposal.
	// Neither is waited for: the receiver is blocked in Recv until the
	// stream ends, which happens only once this handler returns.
	quit := make(chan struct{})
	defer close(quit)
	acks := make(chan []string, 64)
	recvErr := make(chan error, 1)
	go func() {
		defer close(acks)
		for {
			req, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			switch k := req.Kind.(type) {
			case *txmqv1.SubscribeRequest_Ack:
				select {
				case acks <- k.Ack.MessageIds:
				case <-quit:
					return
				}
			case *txmqv1.SubscribeRequest_Nack:
				delay, err := optDuration("nack delay", k.Nack.Delay, bounds.RedeliveryStep)
				if err != nil {
					recvErr <- err
					return
				}
				d.nack(k.Nack.MessageIds, delay, k.Nack.Error)
			case *txmqv1.SubscribeRequest_Extend:
				ext, err := optDuration("deadline extension", k.Extend.Extension, bounds.Extension)
				if err != nil {
					recvErr <- err
					return
				}
				d.extend(k.Extend.MessageIds, ext)
			default:
				recvErr <- invalidf("%s", "after the SubscriptionStart only acks, nacks and extensions may be sent")
				return
			}
		}
	}()
	go func() {
		for ids := range acks {
		drain:
			for {
				select {
				case more, ok := <-acks:
					if !ok {
						break drain
					}
					ids = append(ids, more...)
				default:
					break drain
				}
			}
			actx, cancel := context.WithTimeout(context.Background(), ackTimeout)
			done, err := d.ack(actx, ids)
			cancel()
			if err != nil {
				log.Warn("acks not replicated; the messages will be redelivered", "err", err, "count", len(ids))
				sub.end(err)
				return
			}
			if len(done) > 0 {
				sub.push(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_AckConfirm{
					AckConfirm: &txmqv1.AckConfirm{MessageIds: done},
				}})
			}
		}
	}()

	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				closedByClient = true
				return nil
			}
			if _, ok := status.FromError(err); ok || errors.Is(err, errInvalidArgument) {
				return err
			}
			return fmt.Errorf("%w: %w", errStreamBroken, err)
		case <-sub.signal:
		}
		out, err := sub.take()
		if err != nil {
			return err
		}
		for _, r := range out {
			if err := stream.Send(r); err != nil {
				return err
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

// ensureGroup makes sure the topic (when auto-create is on) and the group
// exist, proposing only what is missing: a reconnect of an existing
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
		return false, nil, err
	case !topicExists:
		if _, err := b.node.CreateTopic(ctx, b.cfg.Now(), &raftpb.CreateTopic{Name: start.Topic}); err != nil {
			return false, nil, err
		}
	}
	r, err := b.node.CreateGroup(ctx, b.cfg.Now(), &raftpb.CreateGroup{
		Topic: start.Topic, Group: start.ConsumerGroup, Start: pos, StartTime: at,
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
