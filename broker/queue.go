package broker

import (
	"cmp"
	"container/heap"
	"slices"
	"time"

	"github.com/txmq/txmq/halfstore/storepb"
)

// entryKey names an unacked message: a sequence of the topic log, or of
// the group's redriven dead letters.
type entryKey struct {
	seq      uint64
	redriven bool
}

// byOrder is the order of delivery: redriven dead letters first, then by
// sequence.
func byOrder(a, b *entry) int {
	if a.key.redriven != b.key.redriven {
		if a.key.redriven {
			return -1
		}
		return 1
	}
	return cmp.Compare(a.key.seq, b.key.seq)
}

func less(a, b *entry) bool { return byOrder(a, b) < 0 }

type entryState int

const (
	// stGone: not in the queue; never admitted, or acked, dead-lettered or
	// dropped by retention.
	stGone entryState = iota
	// stQueued waits behind an earlier message of its ordering key, or its
	// key is held.
	stQueued
	stDelayed  // waits until retryAt
	stReady    // may be handed out now
	stInFlight // at a subscriber until its deadline
	stAcking   // its ack is being replicated
	stFailing  // its failure is being replicated
)

// waiting: not handed out, and nothing being replicated about it.
func (s entryState) waiting() bool { return s == stQueued || s == stDelayed || s == stReady }

// entry is one message the group has not acked, from the moment it was
// read. Its fields change only through the queue's transitions.
type entry struct {
	key      entryKey
	msg      *storepb.Message
	attempts uint32 // deliveries so far (failures recorded before, plus this leader's)
	lastErr  string
	retryAt  time.Time
	state    entryState
	sub      *subscriber // set while at a live subscriber: in flight, or acking from there
	// ackLost: the subscriber acked this delivery, and the ack was not
	// replicated. The consumer did its work: if the stream then ends, the
	// message comes again without counting as a failed delivery.
	ackLost  bool
	deadline time.Time
	// firstDelivery is when this leader first delivered the message.
	firstDelivery time.Time
	idx           int // position in the ready or the delayed heap
}

// deliveryQueue holds the messages of one consumer group on one topic that
// the group has not acked, and the state of each. It has no clock, store or
// metrics: times are arguments, and each transition checks the state it
// starts from and reports whether it changed anything, for the dispatcher
// to replicate, log and count.
//
// Ordering keys: the messages of a key wait in one list, in delivery order.
// Only its first may be released (ready or delayed) or handed out, and
// only while the key is not held, so a key has at most one message on its
// way. A redriven dead letter joins its key's list before every message
// that is waiting, after those being handled.
type deliveryQueue struct {
	entries map[entryKey]*entry
	byID    map[string]*entry
	bytes   int // bodies of the entries
	keys    map[string][]*entry
	held    map[string]bool
	ready   entryHeap // stReady, by less
	delayed entryHeap // stDelayed, by retryAt
	// subs holds, per subscriber, the entries handed to it and still with
	// it: in flight, or acking from there.
	subs     map[*subscriber]map[*entry]struct{}
	inFlight int // entries at a subscriber
}

func newDeliveryQueue() *deliveryQueue {
	return &deliveryQueue{
		entries: map[entryKey]*entry{},
		byID:    map[string]*entry{},
		keys:    map[string][]*entry{},
		held:    map[string]bool{},
		ready:   entryHeap{before: less},
		delayed: entryHeap{before: func(a, b *entry) bool { return a.retryAt.Before(b.retryAt) }},
		subs:    map[*subscriber]map[*entry]struct{}{},
	}
}

// ---- reading the queue ----

// get returns the entry of a message ID, nil when the queue does not hold
// it.
func (q *deliveryQueue) get(id string) *entry { return q.byID[id] }

// count counts the entries; size adds up their bodies.
func (q *deliveryQueue) count() int { return len(q.entries) }
func (q *deliveryQueue) size() int  { return q.bytes }

// inFlightAt counts the entries at a subscriber (in flight, or acking from
// there); inFlightTotal counts them at every subscriber.
func (q *deliveryQueue) inFlightAt(s *subscriber) int { return len(q.subs[s]) }
func (q *deliveryQueue) inFlightTotal() int           { return q.inFlight }

// nextReady is the entry to hand out next, nil when none is ready.
func (q *deliveryQueue) nextReady() *entry { return q.ready.top() }

// handedTo lists the entries in flight at a subscriber, in delivery order.
func (q *deliveryQueue) handedTo(s *subscriber) []*entry {
	var out []*entry
	for e := range q.subs[s] {
		if e.state == stInFlight {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, byOrder)
	return out
}

// nextDue is the earliest deadline in flight or end of a delay; zero when
// there is none.
func (q *deliveryQueue) nextDue() time.Time {
	var next time.Time
	for _, es := range q.subs {
		for e := range es {
			if e.state == stInFlight && (next.IsZero() || e.deadline.Before(next)) {
				next = e.deadline
			}
		}
	}
	if e := q.delayed.top(); e != nil && (next.IsZero() || e.retryAt.Before(next)) {
		next = e.retryAt
	}
	return next
}

// ---- transitions ----

// admit takes in a message read from the log or the redrive bucket, with
// the attempts, last error and retryAt recorded for it. It refuses an
// entry that is in the queue already, or a key the queue holds.
func (q *deliveryQueue) admit(e *entry, now time.Time) bool {
	if e.state != stGone || q.entries[e.key] != nil {
		return false
	}
	q.entries[e.key] = e
	// A redriven dead letter may come in while the failure that
	// dead-lettered its log entry is being applied: the ID names the
	// newest.
	q.byID[e.msg.Id] = e
	q.bytes += len(e.msg.Body)
	e.state = stQueued
	k := e.msg.OrderingKey
	if k == "" {
		q.schedule(e, now)
		return true
	}
	kq := q.keys[k]
	i := len(kq)
	for i > 0 && kq[i-1].state.waiting() && less(e, kq[i-1]) {
		i--
	}
	kq = slices.Insert(kq, i, e)
	q.keys[k] = kq
	if i == 0 && len(kq) > 1 {
		q.unrelease(kq[1])
	}
	q.release(k, now)
	return true
}

// releaseDue makes ready every delayed entry whose retryAt is not after
// now.
func (q *deliveryQueue) releaseDue(now time.Time) {
	for e := q.delayed.top(); e != nil && !e.retryAt.After(now); e = q.delayed.top() {
		heap.Pop(&q.delayed)
		e.state = stReady
		heap.Push(&q.ready, e)
	}
}

// deliver hands a ready entry to a subscriber with room, until deadline.
func (q *deliveryQueue) deliver(e *entry, s *subscriber, now, deadline time.Time) bool {
	if e.state != stReady || q.inFlightAt(s) >= s.max {
		return false
	}
	heap.Remove(&q.ready, e.idx)
	e.state = stInFlight
	e.attempts++
	e.ackLost = false
	e.deadline = deadline
	if e.firstDelivery.IsZero() {
		e.firstDelivery = now
	}
	q.attach(e, s)
	return true
}

// extend moves the deadline of an entry in flight.
func (q *deliveryQueue) extend(e *entry, deadline time.Time) bool {
	if e.state != stInFlight {
		return false
	}
	e.deadline = deadline
	return true
}

// expire begins the failure of every entry in flight whose deadline is
// not after now, and returns them in delivery order.
func (q *deliveryQueue) expire(now time.Time) []*entry {
	var out []*entry
	for _, es := range q.subs {
		for e := range es {
			if e.state == stInFlight && !now.Before(e.deadline) {
				out = append(out, e)
			}
		}
	}
	slices.SortFunc(out, byOrder)
	for _, e := range out {
		q.beginFail(e)
	}
	return out
}

// beginFail ends a delivery without an ack: the entry waits, failing,
// for its failure to be replicated.
func (q *deliveryQueue) beginFail(e *entry) bool {
	if e.state != stInFlight {
		return false
	}
	q.detach(e)
	e.state = stFailing
	return true
}

// retry: the failure is recorded (or could not be; it is retried anyway),
// and the entry waits again until retryAt.
func (q *deliveryQueue) retry(e *entry, retryAt time.Time, lastErr string, now time.Time) bool {
	if e.state != stFailing {
		return false
	}
	e.retryAt, e.lastErr = retryAt, lastErr
	q.requeue(e, now)
	return true
}

// deadLettered: the failure moved the message to the dead-letter queue.
// With holdKey the rest of its ordering key waits for an operator.
func (q *deliveryQueue) deadLettered(e *entry, holdKey bool, now time.Time) bool {
	if e.state != stFailing {
		return false
	}
	if k := e.msg.OrderingKey; k != "" && holdKey {
		q.held[k] = true
	}
	q.forget(e, now)
	return true
}

// handBack takes an entry back from a subscriber that closed its stream
// cleanly, without a failure.
func (q *deliveryQueue) handBack(e *entry, now time.Time) bool {
	if e.state != stInFlight {
		return false
	}
	q.detach(e)
	q.requeue(e, now)
	return true
}

// leave forgets a subscriber once nothing is in flight at it; what it was
// acking is acked, or not, without it.
func (q *deliveryQueue) leave(s *subscriber) bool {
	if len(q.handedTo(s)) > 0 {
		return false
	}
	for e := range q.subs[s] {
		q.detach(e)
	}
	delete(q.subs, s)
	return true
}

// beginAck: an ack of the entry is being replicated. Any entry not acking
// or failing may be acked, in flight or not: an ack that comes after its
// deadline still counts, the consumer did the work.
func (q *deliveryQueue) beginAck(e *entry) bool {
	switch e.state {
	case stReady:
		heap.Remove(&q.ready, e.idx)
	case stDelayed:
		heap.Remove(&q.delayed, e.idx)
	case stQueued, stInFlight:
	default:
		return false
	}
	e.state = stAcking
	return true
}

// ackDone: the ack is replicated; the entry leaves the queue.
func (q *deliveryQueue) ackDone(e *entry, now time.Time) bool {
	if e.state != stAcking {
		return false
	}
	q.detach(e)
	q.forget(e, now)
	return true
}

// ackFailed: the ack was not replicated. The entry goes back in flight if
// its subscriber is still there (marked ackLost), else it waits again.
func (q *deliveryQueue) ackFailed(e *entry, now time.Time) bool {
	if e.state != stAcking {
		return false
	}
	if e.sub != nil {
		e.state, e.ackLost = stInFlight, true
		return true
	}
	q.requeue(e, now)
	return true
}

// hold stops handing out messages of an ordering key; a released first
// message waits again.
func (q *deliveryQueue) hold(k string) {
	q.held[k] = true
	if kq := q.keys[k]; len(kq) > 0 {
		q.unrelease(kq[0])
	}
}

// unholdExcept lets every held ordering key that is not in keep go on.
func (q *deliveryQueue) unholdExcept(keep map[string]bool, now time.Time) {
	for k := range q.held {
		if !keep[k] {
			delete(q.held, k)
			q.release(k, now)
		}
	}
}

// dropBelow forgets the waiting log entries retention dropped (sequence
// below first). Those being handled stay until acked or failed: their ack
// or failure is a no-op in the store.
func (q *deliveryQueue) dropBelow(first uint64, now time.Time) {
	for k, e := range q.entries {
		if !k.redriven && k.seq < first && e.state.waiting() {
			q.forget(e, now)
		}
	}
}

// ---- inside the transitions ----

// schedule releases a queued entry: ready, or delayed until its retryAt.
func (q *deliveryQueue) schedule(e *entry, now time.Time) {
	if e.retryAt.After(now) {
		e.state = stDelayed
		heap.Push(&q.delayed, e)
		return
	}
	e.state = stReady
	heap.Push(&q.ready, e)
}

// unrelease takes a released entry back to queued.
func (q *deliveryQueue) unrelease(e *entry) {
	switch e.state {
	case stReady:
		heap.Remove(&q.ready, e.idx)
	case stDelayed:
		heap.Remove(&q.delayed, e.idx)
	default:
		return
	}
	e.state = stQueued
}

// requeue makes an entry wait again at its place in its ordering key.
func (q *deliveryQueue) requeue(e *entry, now time.Time) {
	e.state = stQueued
	if k := e.msg.OrderingKey; k != "" {
		q.release(k, now)
		return
	}
	q.schedule(e, now)
}

// release schedules the first entry of an ordering key if it is queued
// and the key is not held.
func (q *deliveryQueue) release(k string, now time.Time) {
	kq := q.keys[k]
	if len(kq) > 0 && !q.held[k] && kq[0].state == stQueued {
		q.schedule(kq[0], now)
	}
}

func (q *deliveryQueue) attach(e *entry, s *subscriber) {
	es := q.subs[s]
	if es == nil {
		es = map[*entry]struct{}{}
		q.subs[s] = es
	}
	es[e] = struct{}{}
	e.sub = s
	q.inFlight++
}

func (q *deliveryQueue) detach(e *entry) {
	if e.sub == nil {
		return
	}
	delete(q.subs[e.sub], e)
	e.sub = nil
	q.inFlight--
}

// forget removes a waiting, acking or failing entry and lets the next
// message of its ordering key go.
func (q *deliveryQueue) forget(e *entry, now time.Time) {
	q.unrelease(e)
	delete(q.entries, e.key)
	if q.byID[e.msg.Id] == e {
		delete(q.byID, e.msg.Id)
	}
	q.bytes -= len(e.msg.Body)
	e.state = stGone
	k := e.msg.OrderingKey
	if k == "" {
		return
	}
	kq := q.keys[k]
	i := slices.Index(kq, e)
	kq = slices.Delete(kq, i, i+1)
	if len(kq) == 0 {
		delete(q.keys, k)
		return
	}
	q.keys[k] = kq
	if i == 0 {
		q.release(k, now)
	}
}

// entryHeap is a heap of entries that knows where each is (entry.idx), so
// that a transition can take one out.
type entryHeap struct {
	es     []*entry
	before func(a, b *entry) bool
}

func (h *entryHeap) Len() int           { return len(h.es) }
func (h *entryHeap) Less(i, j int) bool { return h.before(h.es[i], h.es[j]) }
func (h *entryHeap) Swap(i, j int) {
	h.es[i], h.es[j] = h.es[j], h.es[i]
	h.es[i].idx, h.es[j].idx = i, j
}
func (h *entryHeap) Push(x any) {
	e := x.(*entry)
	e.idx = len(h.es)
	h.es = append(h.es, e)
}
func (h *entryHeap) Pop() any {
	n := len(h.es) - 1
	e := h.es[n]
	h.es[n] = nil
	h.es = h.es[:n]
	e.idx = -1
	return e
}

func (h *entryHeap) top() *entry {
	if len(h.es) == 0 {
		return nil
	}
	return h.es[0]
}
