package broker

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type groupKey struct{ topic, group string }

// errDispatcherClosed: leadership moved or the broker is closing.
var errDispatcherClosed = errors.New("delivery stopped on this node")

// readBatch bounds one read of the topic log.
const readBatch = 256

// delivery is one committed message the group has not acked yet, from the
// moment the dispatcher read it from the log.
type delivery struct {
	msg      *storepb.Message
	attempt  uint32
	sub      *subscriber // nil while waiting in ready
	deadline time.Time
	acking   bool // an ack is being replicated: neither expire nor redeliver
}

// dispatcher delivers one topic to one consumer group on the leader. Its
// state is in memory and rebuilt from the store (acked_through and the acks
// above it) when a node becomes leader; acks are replicated before they
// count, so a new leader never skips an unacked message.
type dispatcher struct {
	b   *Broker
	key groupKey
	log *slog.Logger

	mu       sync.Mutex
	subs     []*subscriber
	rr       int
	next     uint64          // next sequence to read from the log
	skip     map[uint64]bool // acked above acked_through when loaded
	inflight map[uint64]*delivery
	byID     map[string]uint64
	ready    []uint64 // sequences to (re)deliver, ascending
	closed   bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
}

// dispatcherFor returns the running dispatcher of a group, starting it if
// needed. Starting waits for the store to have every committed entry
// (Barrier), then loads the group's position.
func (b *Broker) dispatcherFor(ctx context.Context, key groupKey) (*dispatcher, error) {
	b.mu.Lock()
	if d, ok := b.dispatchers[key]; ok {
		b.mu.Unlock()
		return d, nil
	}
	epoch := b.leaderEpoch
	b.mu.Unlock()

	if err := b.node.Barrier(ctx); err != nil {
		return nil, err
	}
	var g *storepb.Group
	var above []uint64
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		if g, err = tx.Group(key.topic, key.group); err != nil {
			return err
		}
		above, err = tx.AckedAbove(key.topic, key.group)
		return err
	})
	if err != nil {
		return nil, err
	}
	d := &dispatcher{
		b:        b,
		key:      key,
		log:      b.log.With("topic", key.topic, "group", key.group),
		next:     g.AckedThrough + 1,
		skip:     map[uint64]bool{},
		inflight: map[uint64]*delivery{},
		byID:     map[string]uint64{},
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	for _, s := range above {
		d.skip[s] = true
	}

	b.mu.Lock()
	defer b.mu.Unlock()
	if existing, ok := b.dispatchers[key]; ok {
		return existing, nil
	}
	select {
	case <-b.stop:
		return nil, errDispatcherClosed
	default:
	}
	if b.leaderEpoch != epoch || !b.node.IsLeader() {
		// Leadership moved while the position was loaded: the client
		// retries, and finds the leader.
		return nil, errDispatcherClosed
	}
	b.dispatchers[key] = d
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		d.run()
	}()
	d.log.Debug("delivery started", "from_seq", d.next)
	return d, nil
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
	for _, dl := range d.inflight {
		if dl.sub != nil {
			inFlight++
		}
	}
	return inFlight, uint32(len(d.subs))
}

func (d *dispatcher) close() {
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
		s.end(errDispatcherClosed)
	}
	<-d.done
}

func (d *dispatcher) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
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

// remove takes a subscriber out; its unacked deliveries go back to ready at
// once instead of waiting for their deadlines.
func (d *dispatcher) remove(s *subscriber) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.subs = slices.DeleteFunc(d.subs, func(x *subscriber) bool { return x == s })
	for seq, dl := range d.inflight {
		if dl.sub == s && !dl.acking {
			dl.sub = nil
			d.addReady(seq)
		}
	}
	d.poke()
}

func (d *dispatcher) addReady(seq uint64) {
	i, found := slices.BinarySearch(d.ready, seq)
	if !found {
		d.ready = slices.Insert(d.ready, i, seq)
	}
}

func (d *dispatcher) run() {
	defer close(d.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		// Take the wake-up channel before reading, so that an append that
		// lands during pump is not missed.
		appended := d.b.notify.wait(d.key.topic)
		next, err := d.pump()
		if err != nil {
			d.log.Error("delivery failed", "err", err)
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
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

// pump expires missed deadlines and hands ready messages to subscribers
// with room. It returns the earliest deadline still pending.
func (d *dispatcher) pump() (time.Time, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	for seq, dl := range d.inflight {
		if dl.sub != nil && !dl.acking && !now.Before(dl.deadline) {
			d.log.Debug("ack deadline missed; will redeliver", "msg_id", dl.msg.Id, "attempt", dl.attempt)
			dl.sub.inflight--
			dl.sub = nil
			d.addReady(seq)
		}
	}
	var err error
	for {
		s := d.pickSubscriber()
		if s == nil {
			break
		}
		seq, ok := d.popReady()
		for !ok {
			// Read on until something is deliverable or the log ends: a
			// batch may hold nothing but messages already acked.
			var more bool
			if more, err = d.readLog(d.freeSlots()); err != nil || !more {
				break
			}
			seq, ok = d.popReady()
		}
		if !ok {
			break
		}
		dl := d.inflight[seq]
		dl.attempt++
		dl.sub = s
		dl.deadline = now.Add(d.b.cfg.AckDeadline)
		s.inflight++
		d.b.metrics.delivered.WithLabelValues(d.key.topic, d.key.group).Inc()
		if dl.attempt > 1 {
			d.b.metrics.redelivered.WithLabelValues(d.key.topic, d.key.group).Inc()
			d.log.Debug("redelivering", "msg_id", dl.msg.Id, "attempt", dl.attempt)
		} else {
			d.log.Debug("delivering", "msg_id", dl.msg.Id, "seq", dl.msg.Sequence)
		}
		s.push(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{
			Delivery: deliveryOf(d.key.topic, dl.msg, dl.attempt),
		}})
	}
	var earliest time.Time
	for _, dl := range d.inflight {
		if dl.sub != nil && !dl.acking && (earliest.IsZero() || dl.deadline.Before(earliest)) {
			earliest = dl.deadline
		}
	}
	return earliest, err
}

func (d *dispatcher) popReady() (uint64, bool) {
	for len(d.ready) > 0 {
		seq := d.ready[0]
		d.ready = d.ready[1:]
		if dl, ok := d.inflight[seq]; ok && !dl.acking {
			return seq, true
		}
	}
	return 0, false
}

// pickSubscriber takes the next subscriber with room, round robin.
func (d *dispatcher) pickSubscriber() *subscriber {
	for i := 0; i < len(d.subs); i++ {
		s := d.subs[(d.rr+i)%len(d.subs)]
		if s.inflight < s.max {
			d.rr = (d.rr + i + 1) % len(d.subs)
			return s
		}
	}
	return nil
}

func (d *dispatcher) freeSlots() int {
	n := 0
	for _, s := range d.subs {
		n += s.max - s.inflight
	}
	return n
}

// readLog reads up to n messages from the log, putting the unacked ones
// into ready. It reports whether it read anything.
func (d *dispatcher) readLog(n int) (bool, error) {
	n = min(max(n, 1), readBatch)
	var msgs []*storepb.Message
	err := d.b.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		msgs, err = tx.ReadTopic(d.key.topic, d.next, n)
		return err
	})
	if err != nil {
		return false, err
	}
	for _, m := range msgs {
		d.next = m.Sequence + 1
		if d.skip[m.Sequence] {
			delete(d.skip, m.Sequence)
			continue
		}
		d.inflight[m.Sequence] = &delivery{msg: m}
		d.byID[m.Id] = m.Sequence
		d.ready = append(d.ready, m.Sequence)
	}
	return len(msgs) > 0, nil
}

// ack replicates the acks of a subscriber and returns the message IDs that
// are now durably acked. IDs the group does not wait for (already acked, or
// unknown) are left out.
func (d *dispatcher) ack(ctx context.Context, ids []string) ([]string, error) {
	d.mu.Lock()
	var seqs []uint64
	var acked []string
	for _, id := range ids {
		seq, ok := d.byID[id]
		if !ok {
			continue
		}
		dl := d.inflight[seq]
		if dl.acking {
			continue
		}
		dl.acking = true
		seqs = append(seqs, seq)
		acked = append(acked, id)
	}
	d.mu.Unlock()
	if len(seqs) == 0 {
		return nil, nil
	}
	_, err := d.b.node.Propose(ctx, &raftpb.Command{Now: d.b.now(), Op: &raftpb.Command_Ack{Ack: &raftpb.Ack{
		Topic: d.key.topic, Group: d.key.group, Sequences: seqs,
	}}})
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	for _, seq := range seqs {
		dl := d.inflight[seq]
		dl.acking = false
		if err != nil {
			if dl.sub == nil {
				d.addReady(seq)
			}
			continue
		}
		if dl.sub != nil {
			dl.sub.inflight--
		}
		delete(d.inflight, seq)
		delete(d.byID, dl.msg.Id)
		d.log.Debug("acked", "msg_id", dl.msg.Id, "attempt", dl.attempt)
	}
	if err == nil {
		d.b.metrics.acked.WithLabelValues(d.key.topic, d.key.group).Add(float64(len(seqs)))
	}
	if err != nil {
		return nil, err
	}
	return acked, nil
}

// subscriber is one Subscribe stream of a group. The dispatcher queues
// responses; the stream's goroutine sends them, so a slow client never
// blocks the dispatcher.
type subscriber struct {
	max      int
	inflight int // guarded by the dispatcher's mu

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
