package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// consumeMaxInFlight is the broker's default window. consume asks for a
// smaller one when --count is smaller, so that it does not pull deliveries it
// will neither print nor ack.
const consumeMaxInFlight = 64

var startPositions = map[string]txmqv1.StartPosition{
	"earliest": txmqv1.StartPosition_START_POSITION_EARLIEST,
	"latest":   txmqv1.StartPosition_START_POSITION_LATEST,
}

func runConsume(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	group := fs.String("group", "", "consumer `group` (required)")
	count := fs.Uint("count", 0, "exit after `N` messages; 0: no limit")
	wait := fs.Duration("wait", 5*time.Second, "exit when no message arrived for this long")
	from := fs.String("from", "earliest", "where a new consumer group starts: earliest or latest")
	pos, err := c.start(fs, args, "TOPIC")
	if err != nil {
		return err
	}
	position, ok := startPositions[*from]
	switch {
	case *group == "":
		return c.usageError(fs, "--group is required")
	case *wait <= 0:
		return c.usageError(fs, "--wait must be positive")
	case !ok:
		return c.usageError(fs, "--from must be earliest or latest, not %q", *from)
	}
	window := uint(consumeMaxInFlight)
	if *count > 0 {
		window = min(window, *count)
	}

	// The stream outlives an interrupt of ctx long enough to collect the ack
	// confirmations for the messages printed already.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := txmqv1.NewConsumerServiceClient(c.conn).Subscribe(sctx)
	if err != nil {
		cancel()
		return err
	}
	s := &consumer{c: c, stream: stream, responses: make(chan received), unconfirmed: map[string]bool{}}
	receiving := make(chan struct{})
	go func() {
		defer close(receiving)
		s.receive(sctx)
	}()
	defer func() {
		cancel()
		<-receiving
	}()

	err = s.send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
		Topic:         pos[0],
		ConsumerGroup: *group,
		StartPosition: position,
		MaxInFlight:   uint32(window),
	}}})
	if err != nil {
		return err
	}
	if err := s.subscribed(ctx); err != nil {
		return err
	}
	if err := s.deliver(ctx, *count, *wait); err != nil {
		return err
	}
	return s.awaitConfirms()
}

// consumer is one Subscribe stream of brokerctl consume.
type consumer struct {
	c         *cli
	stream    grpc.BidiStreamingClient[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]
	responses chan received
	// unconfirmed holds the IDs acked but not yet confirmed as durably acked.
	unconfirmed map[string]bool
}

type received struct {
	resp *txmqv1.SubscribeResponse
	err  error
}

// receive passes what the stream receives to s.responses, until the stream
// fails or ctx ends.
func (s *consumer) receive(ctx context.Context) {
	for {
		resp, err := s.stream.Recv()
		select {
		case s.responses <- received{resp, err}:
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
func (s *consumer) send(req *txmqv1.SubscribeRequest) error {
	if err := s.stream.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// subscribed waits, bounded by --timeout, until the broker accepted the
// subscription, so that --wait measures only the wait for messages. When ctx
// ends first, it returns nil and deliver ends at once.
func (s *consumer) subscribed(ctx context.Context) error {
	deadline := time.NewTimer(s.c.timeout)
	for {
		select {
		case r := <-s.responses:
			switch {
			case errors.Is(r.err, io.EOF):
				return status.Error(codes.Unavailable, "the broker ended the stream without accepting the subscription")
			case r.err != nil:
				return r.err
			case r.resp.GetSubscribed() != nil:
				return nil
			}
		case <-deadline.C:
			return status.Errorf(codes.DeadlineExceeded, "the broker did not accept the subscription within %s", s.c.timeout)
		case <-ctx.Done():
			return nil
		}
	}
}

// deliver prints each delivery and then acks it, until count were printed
// (when count > 0), no delivery arrived for wait, or ctx ends.
func (s *consumer) deliver(ctx context.Context, count uint, wait time.Duration) error {
	idle := time.NewTimer(wait)
	for n := uint(0); count == 0 || n < count; {
		select {
		case r := <-s.responses:
			if r.err != nil {
				return s.ended(r.err)
			}
			switch kind := r.resp.GetKind().(type) {
			case *txmqv1.SubscribeResponse_Delivery:
				if err := s.print(kind.Delivery); err != nil {
					return err
				}
				if err := s.ack(kind.Delivery.GetMessageId()); err != nil {
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
	_, err := fmt.Fprintf(s.c.stdout, "%s  attempt=%d  key=%s  %s\n", d.GetMessageId(), d.GetAttempt(), d.GetKey(), lineBody(d.GetBody()))
	return err
}

func (s *consumer) ack(id string) error {
	s.unconfirmed[id] = true
	return s.send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: []string{id}}}})
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
		case r := <-s.responses:
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

// ended maps the end of the stream to the error to report: none when the
// broker closed it with every ack confirmed.
func (s *consumer) ended(err error) error {
	switch {
	case !errors.Is(err, io.EOF):
		return err
	case len(s.unconfirmed) > 0:
		return status.Errorf(codes.Unavailable, "the broker ended the stream before confirming %d ack(s); those messages may be delivered again", len(s.unconfirmed))
	default:
		return nil
	}
}
