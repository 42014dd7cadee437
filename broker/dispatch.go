package broker

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type groupKey struct{ topic, group string }

// errDispatcherClosed: leadership moved or the broker is closing.
var errDispatcherClosed = errors.New("delivery stopped on this node")

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
// dispatcher runs it.
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
			wait = min(max(next.Sub(d.b.cfg.Now()), time.Millisecond), maxIdle)
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
		d.record(d.b.cfg.Now())
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
	now := d.b.cfg.Now()
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
	now := d.b.cfg.Now()
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
			b.resetDispatcher(groupKey{ev.Topic, ev.Group})
		}
	}
}

// noteDispatchers notes a change in the dispatchers an event concerns: one
// (topic, group), a topic's (empty group) or a group's (empty topic).
func (b *Broker) noteDispatchers(ev raftlog.Event, f func(*changes)) {
	b.mu.Lock()
	var ds []*dispatcher
	for k, d := range b.dispatchers {
		if (ev.Topic == "" || k.topic == ev.Topic) && (ev.Group == "" || k.group == ev.Group) {
			ds = append(ds, d)
		}
	}
	b.mu.Unlock()
	for _, d := range ds {
		d.note(f)
	}
}

// resetDispatcher stops a group's delivery after its position was reset:
// its subscribers resubscribe and a new dispatcher starts at the new
// position. It runs in the background: the FSM must not wait for it.
func (b *Broker) resetDispatcher(key groupKey) {
	b.mu.Lock()
	d, ok := b.dispatchers[key]
	if ok {
		delete(b.dispatchers, key)
	}
	b.mu.Unlock()
	if !ok {
		return
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		d.close(status.Errorf(codes.Unavailable, "consumer group %s was reset on topic %s; subscribe again", key.group, key.topic))
	}()
}

// policy is a consumer group's delivery policy in force.
type policy struct {
	maxDeliveries uint32
	ackDeadline   time.Duration
	backoff       []time.Duration
	hold          bool
}

func (p policy) backoffFor(attempts uint32) time.Duration {
	i := min(int(max(attempts, 1))-1, len(p.backoff)-1)
	return p.backoff[i]
}

// groupPolicy is a consumer group's stored policy over the broker's
// defaults.
func (b *Broker) groupPolicy(tx *halfstore.Tx, group string) (policy, error) {
	cg, err := tx.ConsumerGroup(group)
	if err != nil {
		return policy{}, err
	}
	p := policy{
		maxDeliveries: b.cfg.MaxDeliveries,
		ackDeadline:   b.cfg.AckDeadline,
		backoff:       b.cfg.RedeliveryBackoff,
		hold:          cg.OrderedPoison == uint32(txmqv1.OrderedPoison_ORDERED_POISON_HOLD),
	}
	if cg.MaxDeliveries > 0 {
		p.maxDeliveries = cg.MaxDeliveries
	}
	if cg.AckDeadline > 0 {
		p.ackDeadline = time.Duration(cg.AckDeadline)
	}
	if len(cg.RedeliveryBackoff) > 0 {
		p.backoff = make([]time.Duration, len(cg.RedeliveryBackoff))
		for i, ns := range cg.RedeliveryBackoff {
			p.backoff[i] = time.Duration(ns)
		}
	}
	return p, nil
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
	d := &dispatcher{
		b:    b,
		key:  key,
		log:  b.log.With("topic", key.topic, "group", key.group),
		skip: map[uint64]bool{},
		q:    newDeliveryQueue(),
		wake: make(chan struct{}, 1),
		stop: make(chan struct{}),
		done: make(chan struct{}),
	}
	if err := d.loadPosition(); err != nil {
		return nil, err
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
	d.log.Debug("delivery started", "from_seq", d.next)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		d.run()
	}()
	return d, nil
}

// loadPosition reads, before the dispatcher runs, where the group is: its
// acked_through, the acks above it, its policy and, in hold mode, the
// ordering keys that have a dead letter.
func (d *dispatcher) loadPosition() error {
	return d.b.node.Store().View(func(tx *halfstore.Tx) error {
		g, err := tx.Group(d.key.topic, d.key.group)
		if err != nil {
			return err
		}
		d.next = g.AckedThrough + 1
		d.redriveMore = g.Redriven > 0
		above, err := tx.AckedAbove(d.key.topic, d.key.group)
		if err != nil {
			return err
		}
		for _, s := range above {
			d.skip[s] = true
		}
		if d.pol, err = d.b.groupPolicy(tx, d.key.group); err != nil {
			return err
		}
		if !d.pol.hold {
			return nil
		}
		held, err := tx.DeadLetterKeys(d.key.topic, d.key.group)
		for k := range held {
			d.q.hold(k)
		}
		return err
	})
}

// load reads up to n more messages, redriven dead letters first, then the
// log, and admits them. The store is read without the dispatcher's lock.
// It reports whether it read anything.
func (d *dispatcher) load(n int) (bool, error) {
	d.mu.Lock()
	n = min(max(n, 1), readBatch, readAhead-d.q.len())
	full := n <= 0 || d.q.size() >= readAheadBytes
	d.mu.Unlock()
	if full {
		return false, nil
	}
	es, read, err := d.readBatch(n)
	if err != nil || len(es) == 0 {
		return read, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.b.cfg.Now()
	for _, e := range es {
		d.q.admit(e, now)
	}
	return read, nil
}

// readBatch reads up to n redriven dead letters or, when there are none
// left, up to n log messages with their retry records, and moves the
// reading position past them. It returns the entries to admit (acked ones
// left out) and whether it read anything.
func (d *dispatcher) readBatch(n int) ([]*entry, bool, error) {
	var (
		redriven []*storepb.DeadLetter
		msgs     []halfstore.GroupMessage
	)
	err := d.b.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		if d.redriveMore {
			if redriven, err = tx.ReadRedriven(d.key.topic, d.key.group, d.redriveNext, n); err != nil || len(redriven) > 0 {
				return err
			}
		}
		msgs, err = tx.ReadGroupLog(d.key.topic, d.key.group, d.next, n)
		return err
	})
	if err != nil {
		return nil, false, err
	}
	if d.redriveMore && len(redriven) == 0 {
		d.redriveMore = false
	}
	es := make([]*entry, 0, len(redriven)+len(msgs))
	for _, dl := range redriven {
		d.redriveNext = dl.Message.Sequence + 1
		es = append(es, &entry{key: entryKey{seq: dl.Message.Sequence, redriven: true}, msg: dl.Message,
			attempts: dl.Attempts, lastErr: dl.LastError, retryAt: unixTime(dl.RetryAt)})
	}
	for _, gm := range msgs {
		m := gm.Message
		d.next = m.Sequence + 1
		if d.skip[m.Sequence] {
			delete(d.skip, m.Sequence)
			continue
		}
		e := &entry{key: entryKey{seq: m.Sequence}, msg: m}
		if r := gm.Retry; r != nil {
			e.attempts, e.lastErr, e.retryAt = r.Attempts, r.LastError, unixTime(r.RetryAt)
		}
		es = append(es, e)
	}
	return es, len(redriven)+len(msgs) > 0, nil
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// changeReads is what the store says about the replicated changes of a
// round.
type changeReads struct {
	pol   *policy         // the policy, when it changed
	first uint64          // the topic's first sequence, when trimmed
	held  map[string]bool // the keys to hold, when they may have changed
}

// applyChanges applies the replicated events noted since the last round.
// It reads what they changed from the store without the lock, then applies
// it under the lock.
func (d *dispatcher) applyChanges() error {
	c, pol := d.takeChanges()
	if c == (changes{}) {
		return nil
	}
	r, err := d.readChanges(c, pol)
	if err != nil {
		d.mu.Lock()
		d.heldSince = nil
		d.mu.Unlock()
		return err
	}
	if !d.applyReads(c, r) {
		return nil
	}
	// Redriven dead letters are older than what waits behind them on
	// their ordering key: take them in before letting a held key go, so
	// that they go first.
	for d.redriveMore && err == nil {
		var more bool
		if more, err = d.load(readBatch); !more {
			break
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pol.hold {
		for k := range d.heldSince {
			r.held[k] = true
		}
	}
	d.heldSince = nil
	d.q.unholdExcept(r.held, d.b.cfg.Now())
	return err
}

// takeChanges takes the changes noted so far, with the policy in force.
func (d *dispatcher) takeChanges() (changes, policy) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return changes{}, d.pol
	}
	c := d.changed
	d.changed = changes{}
	if c.redriven || c.purged || c.config {
		// The dead letters' keys may be read: keys that a dead letter
		// holds from now on must stay held whatever the read saw.
		d.heldSince = map[string]bool{}
	}
	return c, d.pol
}

// applyReads applies what the store said of the changes c, holding the
// keys to hold at once. It reports whether the held keys were read: then
// the keys no longer held are let go once redriven dead letters are in.
func (d *dispatcher) applyReads(c changes, r changeReads) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.b.cfg.Now()
	if r.pol != nil {
		d.pol = *r.pol
	}
	if r.first > 0 {
		d.dropBelow(r.first, now)
	}
	if c.redriven {
		d.redriveMore, d.redriveNext = true, 0
	}
	if r.held == nil {
		d.heldSince = nil
		return false
	}
	for k := range r.held {
		d.q.hold(k)
	}
	return true
}

// readChanges reads from the store what the changes c made, given the
// policy in force.
func (d *dispatcher) readChanges(c changes, pol policy) (changeReads, error) {
	var r changeReads
	err := d.b.node.Store().View(func(tx *halfstore.Tx) error {
		reheld := c.redriven || c.purged
		if c.config {
			p, err := d.b.groupPolicy(tx, d.key.group)
			if err != nil {
				return err
			}
			reheld = reheld || p.hold != pol.hold
			r.pol, pol = &p, p
		}
		if c.trimmed {
			tp, err := tx.Topic(d.key.topic)
			if err != nil {
				return err
			}
			r.first = tp.FirstSequence
		}
		if !reheld {
			return nil
		}
		r.held = map[string]bool{}
		if !pol.hold {
			return nil
		}
		var err error
		r.held, err = tx.DeadLetterKeys(d.key.topic, d.key.group)
		return err
	})
	return r, err
}

// dropBelow forgets the log messages retention dropped and moves reading
// past them.
func (d *dispatcher) dropBelow(first uint64, now time.Time) {
	d.next = max(d.next, first)
	for s := range d.skip {
		if s < first {
			delete(d.skip, s)
		}
	}
	d.q.dropBelow(first, now)
}

// failure is a delivery that ended without an ack, waiting to be recorded.
type failure struct {
	e *entry
	// now: redeliver at once (the subscriber went away); else delay, or the
	// backoff schedule when !explicit.
	now      bool
	explicit bool
	delay    time.Duration
	err      string
}

// ack replicates the acks of a subscriber and returns the message IDs that
// are now durably acked. IDs the group does not wait for (already acked,
// unknown, or with an ack or failure being replicated) are left out. An ack
// of a message that is not in flight (it came late, after its deadline) is
// taken: the consumer did the work.
func (d *dispatcher) ack(ctx context.Context, ids []string) ([]string, error) {
	d.mu.Lock()
	var (
		acking []*entry
		acked  []string
		cmd    = &raftpb.Ack{Topic: d.key.topic, Group: d.key.group}
	)
	for _, id := range ids {
		e := d.q.get(id)
		if e == nil || !d.q.beginAck(e) {
			continue
		}
		acking = append(acking, e)
		acked = append(acked, id)
		if e.key.redriven {
			cmd.Redriven = append(cmd.Redriven, e.key.seq)
		} else {
			cmd.Sequences = append(cmd.Sequences, e.key.seq)
		}
	}
	d.mu.Unlock()
	if len(acking) == 0 {
		return nil, nil
	}
	err := d.proposeAck(ctx, cmd)
	now := d.b.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	for _, e := range acking {
		if err != nil {
			d.q.ackFailed(e, now)
			continue
		}
		if !d.q.ackDone(e, now) {
			continue
		}
		d.log.Info("acked", d.msgAttrs(e, "attempt", e.attempts)...)
		if !e.key.redriven {
			d.b.metrics.commitToAck.WithLabelValues(d.key.topic, d.key.group).Observe(sinceCommit(e.msg, now))
			if !e.firstDelivery.IsZero() {
				d.b.metrics.firstToAck.WithLabelValues(d.key.topic, d.key.group).Observe(max(now.Sub(e.firstDelivery), 0).Seconds())
			}
		}
	}
	if err != nil {
		return nil, err
	}
	d.b.metrics.acked.WithLabelValues(d.key.topic, d.key.group).Add(float64(len(acking)))
	return acked, nil
}

func (d *dispatcher) proposeAck(ctx context.Context, cmd *raftpb.Ack) error {
	_, err := d.b.node.Propose(ctx, &raftpb.Command{Now: d.b.now(), Op: &raftpb.Command_Ack{Ack: cmd}})
	return err
}

// nack fails deliveries at the consumer's request.
func (d *dispatcher) nack(ids []string, delay *time.Duration, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if reason == "" {
		reason = "nacked by the consumer"
	}
	for _, id := range ids {
		e := d.q.get(id)
		if e == nil || !d.q.beginFail(e) {
			continue
		}
		f := failure{e: e, err: reason}
		if delay != nil {
			f.explicit, f.delay = true, *delay
		}
		d.fail(f)
	}
	d.poke()
}

// extend pushes the deadlines of deliveries in flight.
func (d *dispatcher) extend(ids []string, by *time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ext := d.pol.ackDeadline
	if by != nil {
		ext = *by
	}
	deadline := d.b.cfg.Now().Add(ext)
	for _, id := range ids {
		if e := d.q.get(id); e != nil {
			d.q.extend(e, deadline)
		}
	}
}

// fail queues a failure the queue has begun (the entry is failing) for
// recording through Raft, before the message is redelivered or
// dead-lettered.
func (d *dispatcher) fail(f failure) {
	d.log.Info("delivery failed", d.msgAttrs(f.e, "attempt", f.e.attempts, "reason", f.err)...)
	d.failed = append(d.failed, f)
}

// record replicates a batch of failures in the background; when it is
// applied, each message is scheduled again or leaves for the DLQ.
func (d *dispatcher) record(now time.Time) {
	batch := d.failed[:min(len(d.failed), recordBatch)]
	d.failed = slices.Clone(d.failed[len(batch):])
	cmd := &raftpb.RecordFailures{Topic: d.key.topic, Group: d.key.group}
	retryAt := make([]time.Time, len(batch))
	for i, f := range batch {
		e := f.e
		switch {
		case f.now:
			retryAt[i] = now
		case f.explicit:
			retryAt[i] = now.Add(f.delay)
		default:
			retryAt[i] = now.Add(d.pol.backoffFor(e.attempts))
		}
		cmd.Failures = append(cmd.Failures, &raftpb.Failure{
			Sequence: e.key.seq,
			Redriven: e.key.redriven,
			Attempts: e.attempts,
			RetryAt:  retryAt[i].UnixNano(),
			Error:    f.err,
			Dead:     e.attempts >= d.pol.maxDeliveries,
		})
	}
	d.recording = true
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		err := d.proposeFailures(cmd, now)
		d.recorded(batch, cmd, retryAt, err)
	}()
}

func (d *dispatcher) proposeFailures(cmd *raftpb.RecordFailures, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	_, err := d.b.node.Propose(ctx, &raftpb.Command{Now: now.UnixNano(), Op: &raftpb.Command_RecordFailures{RecordFailures: cmd}})
	return err
}

// recorded schedules the messages of a recorded batch again, or moves them
// to the DLQ. A batch that could not be recorded is redelivered anyway.
func (d *dispatcher) recorded(batch []failure, cmd *raftpb.RecordFailures, retryAt []time.Time, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	d.recording = false
	if err != nil && !d.closed {
		d.log.Warn("failed deliveries not recorded; redelivering them anyway", "err", err, "count", len(batch))
	}
	now := d.b.cfg.Now()
	for i, f := range batch {
		e := f.e
		if err != nil || !cmd.Failures[i].Dead {
			d.q.retry(e, retryAt[i], f.err, now)
			continue
		}
		if !d.q.deadLettered(e, d.pol.hold, now) {
			continue
		}
		d.b.metrics.deadLettered.WithLabelValues(d.key.topic, d.key.group).Inc()
		d.log.Warn("message moved to the dead-letter queue", d.msgAttrs(e, "attempts", e.attempts,
			"last_error", f.err, "ordering_key", e.msg.OrderingKey)...)
		if k := e.msg.OrderingKey; k != "" && d.pol.hold && d.heldSince != nil {
			d.heldSince[k] = true
		}
	}
}

// subscriber is one Subscribe stream of a group. The dispatcher queues
// responses; the stream's goroutine sends them, so a slow client never
// blocks the dispatcher. What is in flight at it is counted by the
// dispatcher's queue.
type subscriber struct {
	max int

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
	now := d.b.cfg.Now()
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
