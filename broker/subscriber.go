package broker

import (
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// subscriber is one Subscribe stream of a group. The dispatcher queues
// responses; the stream's goroutine sends them, so a slow client never
// blocks the dispatcher. What is in flight at it is counted by the
// dispatcher's queue.
type subscriber struct {
	max int
	// Who it is, for group describe --members: the client's own ID, the
	// stream's peer address, when it subscribed.
	clientID string
	addr     string
	since    time.Time

	mu     sync.Mutex
	queue  []*txmqv1.SubscribeResponse
	err    error
	signal chan struct{}
}

func newSubscriber(maxInFlight int) *subscriber {
	return &subscriber{max: maxInFlight, signal: make(chan struct{}, 1)}
}

func (s *subscriber) push(r *txmqv1.SubscribeResponse) {
	s.mu.Lock()
	s.queue = append(s.queue, r)
	s.mu.Unlock()
	s.notify()
}

func (s *subscriber) notify() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// end makes the stream finish with err after what is queued.
func (s *subscriber) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.notify()
}

// take returns what is queued, or the error the stream must end with.
func (s *subscriber) take() ([]*txmqv1.SubscribeResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queue
	s.queue = nil
	if len(q) == 0 && s.err != nil {
		return nil, s.err
	}
	return q, nil
}

func (d *dispatcher) add(s *subscriber) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errDispatcherClosed
	}
	d.subs = append(d.subs, s)
	d.poke()
	return nil
}

// remove takes a subscriber out; its unacked deliveries are redelivered at
// once instead of after their deadlines. When the stream broke, each counts
// as a failed attempt, so that a message that crashes every consumer taking
// it still ends in the DLQ. When the client closed its side (it hands back
// deliveries it chose not to process), they go back without a failure.
func (d *dispatcher) remove(s *subscriber, closedByClient bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.subs = slices.DeleteFunc(d.subs, func(x *subscriber) bool { return x == s })
	now := d.b.clock.Now()
	for _, e := range d.q.handedTo(s) {
		if closedByClient {
			d.q.handBack(e, now)
		} else if d.q.beginFail(e) {
			d.fail(failure{e: e, now: true, err: "the subscriber went away before acking"})
		}
	}
	d.q.leave(s)
	d.poke()
}

// members describes the subscribers of a group on a topic on this node
// (the leader; none elsewhere).
func (b *Broker) members(topic, group string) []*txmqv1.GroupMember {
	b.mu.Lock()
	d, ok := b.dispatchers[groupKey{topic, group}]
	b.mu.Unlock()
	if !ok {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*txmqv1.GroupMember, 0, len(d.subs))
	for _, s := range d.subs {
		out = append(out, &txmqv1.GroupMember{
			Topic:       topic,
			ClientId:    s.clientID,
			Address:     s.addr,
			InFlight:    uint32(d.q.inFlightAt(s)),
			MaxInFlight: uint32(s.max),
			ConnectedAt: timestamppb.New(s.since),
		})
	}
	return out
}

// pickSubscriber takes the next subscriber with room, round robin.
func (d *dispatcher) pickSubscriber() *subscriber {
	for i := 0; i < len(d.subs); i++ {
		s := d.subs[(d.rr+i)%len(d.subs)]
		if d.q.inFlightAt(s) < s.max {
			d.rr = (d.rr + i + 1) % len(d.subs)
			return s
		}
	}
	return nil
}

// freeSlots counts the deliveries the subscribers have room for.
func (d *dispatcher) freeSlots() int {
	n := 0
	for _, s := range d.subs {
		n += s.max - d.q.inFlightAt(s)
	}
	return n
}
