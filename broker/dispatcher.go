package broker

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
)

type groupKey struct{ topic, group string }

// errDispatcherClosed: leadership moved or the broker is closing.

const (
	// readBatch bounds one read of the topic log.
	readBatch = 256
	// readAhead bounds the unacked messages a dispatcher holds in memory
	// (waiting behind an ordering key, backing off, in flight). When it is
	// full of messages that cannot go yet, reading pauses, like NATS's
	// max_ack_pending.
	readAhead = 8192
	// readAheadBytes bounds the bodies of those messages.
	readAheadBytes = 64 << 20
	// maxIdle: a dispatcher looks at its clock at least this often, so that
	// an injected clock that jumps is noticed.
	maxIdle = time.Second
	// recordBatch bounds the failures recorded in one Raft entry.
	recordBatch = 512
)

// dispatcher delivers one topic to one consumer group on the leader. Its
// state is in memory and rebuilt from the store when a node becomes
// leader: the group's position and acks, the failure count of each message
// that failed before (recorded through Raft), its redriven dead letters.
// Acks and failures are replicated before they count, so a new leader never
// skips an unacked message and never forgets a recorded attempt.
//
// The messages themselves are in a deliveryQueue (queue.go); the
// dispatcher runs it: its loop (this file), reading the store (load.go),
// settling deliveries through Raft (settle.go) and the subscribers
// (subscriber.go).
type dispatcher struct {
	b   *Broker
	key groupKey
	log *slog.Logger

	// Where reading goes on. Only the run goroutine (and dispatcherFor,
	// before it starts) touches these, so the store is read without mu.
	next        uint64          // next log sequence to read
	skip        map[uint64]bool // acked above acked_through when loaded
	redriveNext uint64          // next redriven sequence to read
	redriveMore bool            // the redrive bucket may hold unread entries

	mu        sync.Mutex
	q         *deliveryQueue
	pol       policy
	subs      []*subscriber
	rr        int
	failed    []failure
	recording bool
	changed   changes
	// heldSince collects the ordering keys held by a dead letter while the
	// dead letters' keys are read from the store; nil when no read is on.
	heldSince map[string]bool
	closed    bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
	wg   sync.WaitGroup // failure recorders
}

// changes are replicated events a dispatcher applies on its next round.
type changes struct {
	trimmed, redriven, purged, config bool
}

// DeliveryStats counts a group's deliveries in flight and its subscribers
// on this node (the leader; zero elsewhere).
func (b *Broker) DeliveryStats(topic, group string) (inFlight, subscribers uint32) {
	b.mu.Lock()
	d, ok := b.dispatchers[groupKey{topic, group}]
	b.mu.Unlock()
	if !ok {
		return 0, 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return uint32(d.q.inFlightTotal()), uint32(len(d.subs))
}

// close stops the dispatcher; its subscribers' streams end with err.
func (d *dispatcher) close(err error) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.closed = true
	subs := d.subs
	d.subs = nil
	d.mu.Unlock()
	close(d.stop)
	for _, s := range subs {
		s.end(err)
	}
	<-d.done
	d.wg.Wait()
}

func (d *dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// note records a replicated change for the next round.
func (d *dispatcher) note(f func(*changes)) {
	d.mu.Lock()
	f(&d.changed)
	d.mu.Unlock()
	d.poke()
}

func (d *dispatcher) run() {
	defer close(d.done)
	timer := time.NewTimer(maxIdle)
	defer timer.Stop()
	for {
		// Take the wake-up channel before reading, so that an append that
		// lands during pump is not missed.
		appended := d.b.notify.wait(d.key.topic)
		next, err := d.pump()
		if err != nil {
			d.log.Error("delivery failed", "err", err)
		}
		wait := maxIdle
		if !next.IsZero() {
			wait = min(max(next.Sub(d.b.clock.Now()), time.Millisecond), maxIdle)
		}
		timer.Reset(wait)
		select {
		case <-d.stop:
			return
		case <-d.wake:
		case <-appended:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// pump applies replicated changes, fails missed deadlines, releases what is
// due and hands ready messages to subscribers with room, reading more from
// the store while they have room and nothing is ready. It returns when it
// next has something to do (a deadline or the end of a backoff).
func (d *dispatcher) pump() (time.Time, error) {
	err := d.applyChanges()
	d.settleDue()
	for err == nil {
		want := d.handOut()
		if want == 0 {
			break
		}
		// Read on until something is deliverable or there is nothing
		// more: a batch may hold only acked messages, or messages behind
		// their ordering key.
		var more bool
		if more, err = d.load(want); !more {
			break
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return time.Time{}, nil
	}
	if len(d.failed) > 0 && !d.recording {
		d.record(d.b.clock.Now())
	}
	return d.q.nextDue(), err
}

// settleDue fails missed deadlines and releases what is due.
func (d *dispatcher) settleDue() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return
	}
	now := d.b.clock.Now()
	for _, e := range d.q.expire(now) {
		d.fail(failure{e: e, err: "ack deadline missed"})
	}
	d.q.releaseDue(now)
}

// handOut delivers ready messages to subscribers with room, round robin.
// It returns how many more messages the subscribers could take when
// nothing is ready: what to read.
func (d *dispatcher) handOut() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0
	}
	now := d.b.clock.Now()
	for {
		e := d.q.nextReady()
		if e == nil {
			return d.freeSlots()
		}
		s := d.pickSubscriber()
		if s == nil {
			return 0
		}
		d.deliver(e, s, now)
	}
}

// deliver hands e to s, and counts and logs it.
func (d *dispatcher) deliver(e *entry, s *subscriber, now time.Time) {
	first := e.firstDelivery.IsZero()
	if !d.q.deliver(e, s, now, now.Add(d.pol.ackDeadline)) {
		return
	}
	m := d.b.metrics
	m.delivered.WithLabelValues(d.key.topic, d.key.group).Inc()
	if e.attempts > 1 {
		m.redelivered.WithLabelValues(d.key.topic, d.key.group).Inc()
	}
	// A redriven dead letter's first delivery was long ago: its time
	// since the commit is the operator's, not the broker's.
	if first && e.attempts == 1 && !e.key.redriven {
		m.commitToFirst.WithLabelValues(d.key.topic, d.key.group).Observe(sinceCommit(e.msg, now))
	}
	attrs := d.msgAttrs(e, "seq", e.msg.Sequence, "attempt", e.attempts)
	if e.lastErr != "" {
		attrs = append(attrs, "last_error", e.lastErr)
	}
	d.log.Info("delivered", attrs...)
	dl := deliveryOf(d.key.topic, e.msg, e.attempts)
	dl.AckDeadline = timestamppb.New(e.deadline)
	dl.LastError = e.lastErr
	s.push(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: dl}})
}

// sinceCommit is the time in seconds from a message's commit to now.
func sinceCommit(m *storepb.Message, now time.Time) float64 {
	return max(now.Sub(time.Unix(0, m.CommittedAt)), 0).Seconds()
}

// msgAttrs are a message's log attributes (the dispatcher's logger adds
// topic and consumer group), then more.
func (d *dispatcher) msgAttrs(e *entry, more ...any) []any {
	attrs := []any{"msg_id", e.msg.Id}
	if e.msg.TransactionId != "" {
		attrs = append(attrs, "tx_id", e.msg.TransactionId, "producer_group", e.msg.ProducerGroup)
	}
	if e.key.redriven {
		attrs = append(attrs, "redriven", true)
	}
	return append(attrs, more...)
}

// onApply routes replicated events to the running dispatchers they change.
func (b *Broker) onApply(events []raftlog.Event) {
	b.notify.onApply(events)
	for _, ev := range events {
		switch ev.Kind {
		case raftlog.EventResolved:
			b.metrics.observeResolved(ev.Half)
		case raftlog.EventTrimmed:
			b.noteDispatchers(ev, func(c *changes) { c.trimmed = true })
		case raftlog.EventRedriven:
			b.noteDispatchers(ev, func(c *changes) { c.redriven = true })
		case raftlog.EventPurged:
			b.noteDispatchers(ev, func(c *changes) { c.purged = true })
		case raftlog.EventGroupConfig:
			b.noteDispatchers(ev, func(c *changes) { c.config = true })
		case raftlog.EventGroupReset:
			b.endDelivery(ev, fmt.Errorf("%w: consumer group %s on topic %s", errGroupReset, ev.Group, ev.Topic))
		case raftlog.EventDeleted:
			what := fmt.Sprintf("consumer group %q on topic %q", ev.Group, ev.Topic)
			if ev.Group == "" {
				what = fmt.Sprintf("topic %q", ev.Topic)
			}
			b.endDelivery(ev, fmt.Errorf("%w: %s was deleted by an operator", halfstore.ErrNotFound, what))
		}
	}
}

// dispatchersOf are the running dispatchers an event concerns: one (topic,
// group), a topic's (empty group) or a group's (empty topic). With remove,
// they are taken out of the broker's map.
func (b *Broker) dispatchersOf(ev raftlog.Event, remove bool) []*dispatcher {
	b.mu.Lock()
	defer b.mu.Unlock()
	var ds []*dispatcher
	for k, d := range b.dispatchers {
		if (ev.Topic == "" || k.topic == ev.Topic) && (ev.Group == "" || k.group == ev.Group) {
			ds = append(ds, d)
			if remove {
				delete(b.dispatchers, k)
			}
		}
	}
	return ds
}

// noteDispatchers notes a change in the dispatchers an event concerns.
func (b *Broker) noteDispatchers(ev raftlog.Event, f func(*changes)) {
	for _, d := range b.dispatchersOf(ev, false) {
		d.note(f)
	}
}

// endDelivery stops the delivery an event ended: after a reset the
// subscribers resubscribe and a new dispatcher starts at the new position;
// after a deletion they end with NotFound. It runs in the background: the
// FSM must not wait for it.
func (b *Broker) endDelivery(ev raftlog.Event, err error) {
	ds := b.dispatchersOf(ev, true)
	if len(ds) == 0 {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for _, d := range ds {
			d.close(err)
		}
	}()
}
