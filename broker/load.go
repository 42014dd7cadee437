package broker

import (
	"context"
	"time"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

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
		hold:          cg.OrderedPoison == storepb.OrderedPoison_ORDERED_POISON_HOLD,
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
	n = min(max(n, 1), readBatch, readAhead-d.q.count())
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
	now := d.b.clock.Now()
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
	err := d.b.node.Store().Writer().Read(func(tx *halfstore.Tx) error {
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
	d.q.unholdExcept(r.held, d.b.clock.Now())
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
	now := d.b.clock.Now()
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
	err := d.b.node.Store().Writer().Read(func(tx *halfstore.Tx) error {
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
