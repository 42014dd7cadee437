package broker

import (
	"container/heap"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type groupKey struct{ topic, group string }

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

// entryKey names an unacked message: a sequence of the topic log, or of
// the group's redriven dead letters.
type entryKey struct {
	seq      uint64
	redriven bool
}

type entryState int

const (
	stQueued   entryState = iota // behind an earlier message of its ordering key
	stDelayed                    // backing off until retryAt
	stReady                      // deliverable now
	stInFlight                   // delivered, waiting for an ack
	stAcking                     // ack being replicated
	stFailing                    // failure being replicated
)

// entry is one message the group has not acked, from the moment the
// dispatcher read it.
type entry struct {
	key      entryKey
	msg      *storepb.Message
	attempts uint32 // deliveries so far (failures recorded before, plus this leader's)
	lastErr  string
	retryAt  time.Time
	state    entryState
	sub      *subscriber // set while delivered to a live subscriber
	deadline time.Time
	// firstDelivery is when this leader first delivered the message.
	firstDelivery time.Time
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

// dispatcher delivers one topic to one consumer group on the leader. Its
// state is in memory and rebuilt from the store when a node becomes
// leader: the group's position and acks, the failure count of each message
// that failed before (recorded through Raft), its redriven dead letters.
// Acks and failures are replicated before they count, so a new leader never
// skips an unacked message and never forgets a recorded attempt.
type dispatcher struct {
	b   *Broker
	key groupKey
	log *slog.Logger

	mu          sync.Mutex
	pol         policy
	subs        []*subscriber
	rr          int
	next        uint64          // next log sequence to read
	skip        map[uint64]bool // acked above acked_through when loaded
	redriveNext uint64          // next redriven sequence to read
	redriveMore bool            // the redrive bucket may hold unread entries
	entries     map[entryKey]*entry
	bytes       int // bodies of the entries
	byID        map[string]*entry
	ready       []*entry // state stReady, by (redriven first, sequence); stale ones skipped
	delayed     delayHeap
	inflight    map[*entry]struct{}
	keys        map[string][]*entry // ordering key -> its unacked messages, commit order
	held        map[string]bool     // ordering keys held behind a dead letter
	failed      []failure
	recording   bool
	changed     changes
	closed      bool

	wake chan struct{}
	stop chan struct{}
	done chan struct{}
	wg   sync.WaitGroup // failure recorders
}

// changes are replicated events a dispatcher applies on its next round.
type changes struct {
	trimmed, redriven, purged, config bool
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
		b:        b,
		key:      key,
		log:      b.log.With("topic", key.topic, "group", key.group),
		skip:     map[uint64]bool{},
		entries:  map[entryKey]*entry{},
		byID:     map[string]*entry{},
		inflight: map[*entry]struct{}{},
		keys:     map[string][]*entry{},
		held:     map[string]bool{},
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		g, err := tx.Group(key.topic, key.group)
		if err != nil {
			return err
		}
		d.next = g.AckedThrough + 1
		d.redriveMore = g.Redriven > 0
		above, err := tx.AckedAbove(key.topic, key.group)
		if err != nil {
			return err
		}
		for _, s := range above {
			d.skip[s] = true
		}
		if d.pol, err = b.groupPolicy(tx, key.group); err != nil {
			return err
		}
		if d.pol.hold {
			d.held, err = tx.DeadLetterKeys(key.topic, key.group)
		}
		return err
	})
	if err != nil {
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
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		d.run()
	}()
	d.log.Debug("delivery started", "from_seq", d.next)
	return d, nil
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
	return uint32(len(d.inflight)), uint32(len(d.subs))
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
	for e := range d.inflight {
		if e.sub != s {
			continue
		}
		switch {
		case e.state == stInFlight && closedByClient:
			s.inflight--
			e.sub = nil
			delete(d.inflight, e)
			d.schedule(e)
		case e.state == stInFlight:
			d.fail(failure{e: e, now: true, err: "the subscriber went away before acking"})
		default:
			e.sub = nil
			delete(d.inflight, e)
		}
	}
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
// due and hands ready messages to subscribers with room. It returns when
// it next has something to do (a deadline or the end of a backoff).
func (d *dispatcher) pump() (time.Time, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return time.Time{}, nil
	}
	err := d.applyChanges()
	now := d.b.cfg.Now()
	for e := range d.inflight {
		if e.state == stInFlight && !now.Before(e.deadline) {
			d.fail(failure{e: e, err: "ack deadline missed"})
		}
	}
	for d.delayed.Len() > 0 && !d.delayed[0].at.After(now) {
		it := heap.Pop(&d.delayed).(delayItem)
		if it.e.state == stDelayed && it.e.retryAt.Equal(it.at) {
			d.makeReady(it.e)
		}
	}
	for err == nil {
		s := d.pickSubscriber()
		if s == nil {
			break
		}
		e := d.popReady()
		for e == nil {
			// Read on until something is deliverable or there is nothing
			// more: a batch may hold only acked messages, or messages
			// behind their ordering key.
			var more bool
			if more, err = d.read(d.freeSlots()); err != nil || !more {
				break
			}
			e = d.popReady()
		}
		if e == nil {
			break
		}
		d.deliver(e, s, now)
	}
	if len(d.failed) > 0 && !d.recording {
		d.record(now)
	}
	var next time.Time
	for e := range d.inflight {
		if e.state == stInFlight && (next.IsZero() || e.deadline.Before(next)) {
			next = e.deadline
		}
	}
	if d.delayed.Len() > 0 && (next.IsZero() || d.delayed[0].at.Before(next)) {
		next = d.delayed[0].at
	}
	return next, err
}

func (d *dispatcher) deliver(e *entry, s *subscriber, now time.Time) {
	e.attempts++
	e.state = stInFlight
	e.sub = s
	e.deadline = now.Add(d.pol.ackDeadline)
	d.inflight[e] = struct{}{}
	s.inflight++
	m := d.b.metrics
	m.delivered.WithLabelValues(d.key.topic, d.key.group).Inc()
	if e.attempts > 1 {
		m.redelivered.WithLabelValues(d.key.topic, d.key.group).Inc()
	}
	if e.firstDelivery.IsZero() {
		e.firstDelivery = now
		// A redriven dead letter's first delivery was long ago: its time
		// since the commit is the operator's, not the broker's.
		if e.attempts == 1 && !e.key.redriven {
			m.commitToFirst.WithLabelValues(d.key.topic, d.key.group).Observe(sinceCommit(e.msg, now))
		}
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

// fail ends a delivery without an ack; the failure is recorded through
// Raft before the message is redelivered or dead-lettered.
func (d *dispatcher) fail(f failure) {
	e := f.e
	d.log.Info("delivery failed", d.msgAttrs(e, "attempt", e.attempts, "reason", f.err)...)
	if e.sub != nil {
		e.sub.inflight--
		e.sub = nil
	}
	delete(d.inflight, e)
	e.state = stFailing
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
		ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
		_, err := d.b.node.RecordFailures(ctx, now, cmd)
		cancel()
		d.mu.Lock()
		defer d.mu.Unlock()
		defer d.poke()
		d.recording = false
		if err != nil && !d.closed {
			d.log.Warn("failed deliveries not recorded; redelivering them anyway", "err", err, "count", len(batch))
		}
		for i, f := range batch {
			e := f.e
			if e.state != stFailing {
				continue
			}
			e.lastErr = f.err
			if err == nil && cmd.Failures[i].Dead {
				d.deadLettered(e)
				continue
			}
			e.retryAt = retryAt[i]
			d.schedule(e)
		}
	}()
}

func (d *dispatcher) deadLettered(e *entry) {
	d.b.metrics.deadLettered.WithLabelValues(d.key.topic, d.key.group).Inc()
	d.log.Warn("message moved to the dead-letter queue", d.msgAttrs(e, "attempts", e.attempts,
		"last_error", e.lastErr, "ordering_key", e.msg.OrderingKey)...)
	if k := e.msg.OrderingKey; k != "" && d.pol.hold {
		d.held[k] = true
	}
	d.forget(e)
}

// admit takes in a message read from the log or the redrive bucket.
func (d *dispatcher) admit(e *entry) {
	d.entries[e.key] = e
	d.bytes += len(e.msg.Body)
	d.byID[e.msg.Id] = e
	e.state = stQueued
	k := e.msg.OrderingKey
	if k == "" {
		d.schedule(e)
		return
	}
	q := d.keys[k]
	// Commit order, but never in front of a message of the key that is
	// already on its way (a redriven dead letter comes after it).
	i := len(q)
	for i > 0 && q[i-1].state == stQueued && less(e, q[i-1]) {
		i--
	}
	q = slices.Insert(q, i, e)
	d.keys[k] = q
	if i == 0 && !d.held[k] {
		d.schedule(e)
	}
}

// schedule makes an entry ready, or delays it until its retryAt.
func (d *dispatcher) schedule(e *entry) {
	if e.retryAt.After(d.b.cfg.Now()) {
		e.state = stDelayed
		heap.Push(&d.delayed, delayItem{at: e.retryAt, e: e})
		return
	}
	d.makeReady(e)
}

func less(a, b *entry) bool {
	if a.key.redriven != b.key.redriven {
		return a.key.redriven
	}
	return a.key.seq < b.key.seq
}

func (d *dispatcher) makeReady(e *entry) {
	e.state = stReady
	i, _ := slices.BinarySearchFunc(d.ready, e, func(x, y *entry) int {
		switch {
		case less(x, y):
			return -1
		case less(y, x):
			return 1
		}
		return 0
	})
	d.ready = slices.Insert(d.ready, i, e)
}

func (d *dispatcher) popReady() *entry {
	for len(d.ready) > 0 {
		e := d.ready[0]
		d.ready[0] = nil
		d.ready = d.ready[1:]
		if e.state == stReady {
			return e
		}
	}
	return nil
}

// forget drops an entry that is acked, dead-lettered or trimmed, and lets
// the next message of its ordering key go.
func (d *dispatcher) forget(e *entry) {
	if _, ok := d.entries[e.key]; ok {
		d.bytes -= len(e.msg.Body)
	}
	delete(d.entries, e.key)
	delete(d.byID, e.msg.Id)
	delete(d.inflight, e)
	e.state = -1
	k := e.msg.OrderingKey
	if k == "" {
		return
	}
	q := d.keys[k]
	i := slices.Index(q, e)
	if i < 0 {
		return
	}
	q = slices.Delete(q, i, i+1)
	if len(q) == 0 {
		delete(d.keys, k)
		return
	}
	d.keys[k] = q
	if i == 0 {
		d.releaseKey(k)
	}
}

// releaseKey lets the head of an ordering key go, unless the key is held.
func (d *dispatcher) releaseKey(k string) {
	q := d.keys[k]
	if len(q) == 0 || d.held[k] || q[0].state != stQueued {
		return
	}
	d.schedule(q[0])
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

// read takes in up to n more messages: redriven dead letters first, then
// the log. It reports whether it read anything.
func (d *dispatcher) read(n int) (bool, error) {
	n = min(max(n, 1), readBatch, readAhead-len(d.entries))
	if n <= 0 || d.bytes >= readAheadBytes {
		return false, nil
	}
	var (
		redriven []*storepb.DeadLetter
		msgs     []*storepb.Message
		retries  []*storepb.Retry
	)
	err := d.b.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		if d.redriveMore {
			if redriven, err = tx.ReadRedriven(d.key.topic, d.key.group, d.redriveNext, n); err != nil {
				return err
			}
			if len(redriven) > 0 {
				return nil
			}
		}
		if msgs, err = tx.ReadTopic(d.key.topic, d.next, n); err != nil {
			return err
		}
		retries = make([]*storepb.Retry, len(msgs))
		for i, m := range msgs {
			if d.skip[m.Sequence] {
				continue
			}
			if retries[i], err = tx.Retry(d.key.topic, d.key.group, m.Sequence); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return false, err
	}
	if d.redriveMore && len(redriven) == 0 {
		d.redriveMore = false
	}
	for _, dl := range redriven {
		d.redriveNext = dl.Message.Sequence + 1
		k := entryKey{seq: dl.Message.Sequence, redriven: true}
		if _, ok := d.entries[k]; ok {
			continue
		}
		d.admit(&entry{key: k, msg: dl.Message, attempts: dl.Attempts, lastErr: dl.LastError, retryAt: unixTime(dl.RetryAt)})
	}
	for i, m := range msgs {
		d.next = m.Sequence + 1
		if d.skip[m.Sequence] {
			delete(d.skip, m.Sequence)
			continue
		}
		e := &entry{key: entryKey{seq: m.Sequence}, msg: m}
		if r := retries[i]; r != nil {
			e.attempts, e.lastErr, e.retryAt = r.Attempts, r.LastError, unixTime(r.RetryAt)
		}
		d.admit(e)
	}
	return len(redriven)+len(msgs) > 0, nil
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// applyChanges applies the replicated events noted since the last round.
func (d *dispatcher) applyChanges() error {
	c := d.changed
	d.changed = changes{}
	if c == (changes{}) {
		return nil
	}
	var old map[string]bool
	err := d.b.node.Store().View(func(tx *halfstore.Tx) error {
		if c.config {
			p, err := d.b.groupPolicy(tx, d.key.group)
			if err != nil {
				return err
			}
			c.purged = c.purged || p.hold != d.pol.hold
			d.pol = p
		}
		if c.trimmed {
			tp, err := tx.Topic(d.key.topic)
			if err != nil {
				return err
			}
			d.dropBelow(tp.FirstSequence)
		}
		if c.redriven {
			d.redriveMore, d.redriveNext = true, 0
		}
		if c.redriven || c.purged {
			held := map[string]bool{}
			if d.pol.hold {
				var err error
				if held, err = tx.DeadLetterKeys(d.key.topic, d.key.group); err != nil {
					return err
				}
			}
			old, d.held = d.held, held
		}
		return nil
	})
	if err != nil || old == nil {
		return err
	}
	// Redriven dead letters are older than what waits behind them on
	// their ordering key: take them in before letting a held key go, so
	// that they go first.
	for d.redriveMore && err == nil {
		var more bool
		if more, err = d.read(readBatch); !more {
			break
		}
	}
	for k := range old {
		d.releaseKey(k)
	}
	return err
}

// dropBelow forgets log messages retention dropped. Those in flight stay
// until acked or failed: their ack or failure is a no-op in the store.
func (d *dispatcher) dropBelow(first uint64) {
	if first == 0 {
		return
	}
	d.next = max(d.next, first)
	for s := range d.skip {
		if s < first {
			delete(d.skip, s)
		}
	}
	for k, e := range d.entries {
		if !k.redriven && k.seq < first && e.state != stInFlight && e.state != stAcking && e.state != stFailing {
			d.forget(e)
		}
	}
}

// nack fails deliveries at the consumer's request.
func (d *dispatcher) nack(ids []string, delay *time.Duration, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if reason == "" {
		reason = "nacked by the consumer"
	}
	for _, id := range ids {
		e := d.byID[id]
		if e == nil || e.state != stInFlight {
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
		if e := d.byID[id]; e != nil && e.state == stInFlight {
			e.deadline = deadline
		}
	}
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
		prev   []entryState
		acked  []string
		cmd    = &raftpb.Ack{Topic: d.key.topic, Group: d.key.group}
	)
	for _, id := range ids {
		e := d.byID[id]
		if e == nil || e.state == stAcking || e.state == stFailing {
			continue
		}
		prev = append(prev, e.state)
		e.state = stAcking
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
	_, err := d.b.node.Ack(ctx, d.b.cfg.Now(), cmd)
	now := d.b.cfg.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	for i, e := range acking {
		if e.state != stAcking {
			continue
		}
		if err != nil {
			switch {
			case e.sub != nil:
				e.state = stInFlight
			case prev[i] == stQueued:
				e.state = stQueued
			default:
				d.schedule(e)
			}
			continue
		}
		if e.sub != nil {
			e.sub.inflight--
			e.sub = nil
		}
		d.forget(e)
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
		d.close(fmt.Errorf("%w: consumer group %s on topic %s", errGroupReset, key.group, key.topic))
	}()
}

// delayHeap orders backing-off entries by the end of their backoff.
// Entries rescheduled since are left in and skipped when popped.
type delayItem struct {
	at time.Time
	e  *entry
}

type delayHeap []delayItem

func (h delayHeap) Len() int           { return len(h) }
func (h delayHeap) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h delayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)        { *h = append(*h, x.(delayItem)) }
func (h *delayHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = delayItem{}
	*h = old[:len(old)-1]
	return it
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
