package broker

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

var stateNames = map[entryState]string{stGone: "gone", stQueued: "queued", stDelayed: "delayed",
	stReady: "ready", stInFlight: "in flight", stAcking: "acking", stFailing: "failing"}

var qStart = time.Unix(1_800_000_000, 0)

func logEntry(seq uint64, key string, body int) *entry {
	return &entry{key: entryKey{seq: seq}, msg: &storepb.Message{
		Id: fmt.Sprintf("m%d", seq), Sequence: seq, OrderingKey: key, Body: make([]byte, body)}}
}

// redrivenEntry is msg's dead letter, redriven: attempts reset.
func redrivenEntry(msg *storepb.Message) *entry {
	return &entry{key: entryKey{seq: msg.Sequence, redriven: true}, msg: msg}
}

func states(es ...*entry) string {
	var out []string
	for _, e := range es {
		out = append(out, e.msg.Id+":"+stateNames[e.state])
	}
	return strings.Join(out, " ")
}

// ---- direct tests of the transitions ----

func TestQueueOrderingKeyOneAtATime(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	a1, a2, b1, u := logEntry(1, "a", 1), logEntry(2, "a", 2), logEntry(3, "b", 3), logEntry(4, "", 4)
	for _, e := range []*entry{a1, a2, b1, u} {
		require.True(t, q.admit(e, qStart))
	}
	require.False(t, q.admit(logEntry(1, "a", 1), qStart), "a sequence the queue holds")
	require.Equal(t, "m1:ready m2:queued m3:ready m4:ready", states(a1, a2, b1, u))
	require.Equal(t, 10, q.size())
	for _, want := range []*entry{a1, b1, u} {
		e := q.nextReady()
		require.Same(t, want, e)
		require.True(t, q.deliver(e, s, qStart, qStart.Add(time.Second)))
	}
	require.Nil(t, q.nextReady(), "a2 waits for a1")
	require.Equal(t, 3, q.inFlightAt(s))
	require.True(t, q.beginAck(a1))
	require.True(t, q.ackDone(a1, qStart))
	require.Equal(t, stGone, a1.state)
	require.Nil(t, q.get("m1"))
	require.Same(t, a2, q.nextReady(), "a1 acked: a2 goes")
	require.Equal(t, 2, q.inFlightAt(s))
	require.Equal(t, 9, q.size())
}

func TestQueueDelayDeadlineRetry(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(1)
	e := logEntry(1, "", 0)
	e.attempts, e.retryAt = 2, qStart.Add(5*time.Second)
	require.True(t, q.admit(e, qStart))
	require.Equal(t, stDelayed, e.state, "failed before: waits for its retry time")
	require.Equal(t, e.retryAt, q.nextDue())
	q.releaseDue(qStart.Add(5*time.Second - time.Nanosecond))
	require.Nil(t, q.nextReady())
	q.releaseDue(qStart.Add(5 * time.Second))
	require.Same(t, e, q.nextReady())
	now := qStart.Add(5 * time.Second)
	require.True(t, q.deliver(e, s, now, now.Add(30*time.Second)))
	require.Equal(t, uint32(3), e.attempts)
	require.Equal(t, now, e.firstDelivery)
	require.False(t, q.deliver(logEntry(2, "", 0), s, now, now), "not ready")
	require.Empty(t, q.expire(now.Add(30*time.Second-time.Nanosecond)))
	require.True(t, q.extend(e, now.Add(40*time.Second)))
	require.Equal(t, now.Add(40*time.Second), q.nextDue())
	now = now.Add(40 * time.Second)
	require.Equal(t, []*entry{e}, q.expire(now))
	require.Equal(t, stFailing, e.state)
	require.Zero(t, q.inFlightAt(s), "a failing delivery frees its slot")
	require.True(t, q.retry(e, now.Add(time.Second), "ack deadline missed", now))
	require.Equal(t, stDelayed, e.state)
	require.Equal(t, "ack deadline missed", e.lastErr)
}

// A redriven dead letter goes before the messages of its key that wait,
// ready or backing off included, but after one being handled.
func TestQueueRedrivenGoesFirst(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	a2, a3 := logEntry(2, "a", 0), logEntry(3, "a", 0)
	a2.retryAt = qStart.Add(time.Minute)
	require.True(t, q.admit(a2, qStart))
	require.True(t, q.admit(a3, qStart))
	require.Equal(t, "m2:delayed m3:queued", states(a2, a3))
	a1 := redrivenEntry(logEntry(1, "a", 0).msg)
	require.True(t, q.admit(a1, qStart))
	require.Equal(t, "m1:ready m2:queued m3:queued", states(a1, a2, a3))
	require.Equal(t, []*entry{a1, a2, a3}, q.keys["a"])

	b1 := logEntry(4, "b", 0)
	require.True(t, q.admit(b1, qStart))
	require.Same(t, a1, q.nextReady(), "redriven first, then by sequence")
	require.True(t, q.deliver(a1, s, qStart, qStart.Add(time.Minute)))
	require.True(t, q.deliver(b1, s, qStart, qStart.Add(time.Minute)))
	b0 := redrivenEntry(logEntry(0, "b", 0).msg)
	require.True(t, q.admit(b0, qStart))
	require.Equal(t, []*entry{b1, b0}, q.keys["b"], "b1 is in flight: the redriven b0 comes after it")
	require.Equal(t, stQueued, b0.state)
}

// A redrive can be applied between the failure that dead-letters a log
// message and its completion: the redriven entry comes in while the log
// entry still fails, and the message ID names the redriven one throughout.
func TestQueueRedrivenWhileItsLogEntryFails(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	e := logEntry(1, "", 0)
	require.True(t, q.admit(e, qStart))
	require.True(t, q.deliver(e, s, qStart, qStart.Add(time.Minute)))
	require.True(t, q.beginFail(e))
	r := redrivenEntry(e.msg)
	require.True(t, q.admit(r, qStart))
	require.Same(t, r, q.get("m1"))
	require.True(t, q.deadLettered(e, false, qStart))
	require.Same(t, r, q.get("m1"), "forgetting the log entry keeps the redriven one")
	require.True(t, q.beginAck(q.get("m1")))
}

func TestQueueHold(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	a1, a2, b1 := logEntry(1, "a", 0), logEntry(2, "a", 0), logEntry(3, "b", 0)
	for _, e := range []*entry{a1, a2, b1} {
		require.True(t, q.admit(e, qStart))
	}
	q.hold("b")
	require.Equal(t, stQueued, b1.state, "holding takes a ready message back")
	require.True(t, q.deliver(a1, s, qStart, qStart.Add(time.Minute)))
	require.True(t, q.beginFail(a1))
	require.True(t, q.deadLettered(a1, true, qStart))
	require.Equal(t, "m1:gone m2:queued", states(a1, a2), "dead letter in hold mode: the key waits")
	q.unholdExcept(map[string]bool{"a": true}, qStart)
	require.Equal(t, "m2:queued m3:ready", states(a2, b1))
	q.unholdExcept(nil, qStart)
	require.Equal(t, stReady, a2.state)
}

// An ack that is not replicated gives the entry back as it was, and a
// late ack of a queued message that became its key's first releases it.
func TestQueueAckFailed(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	a1, a2 := logEntry(1, "a", 0), logEntry(2, "a", 0)
	require.True(t, q.admit(a1, qStart))
	require.True(t, q.admit(a2, qStart))
	require.True(t, q.deliver(a1, s, qStart, qStart.Add(time.Minute)))
	require.True(t, q.beginAck(a1))
	require.False(t, q.beginAck(a1), "already acking")
	require.False(t, q.beginFail(a1), "acking, not in flight")
	require.True(t, q.ackFailed(a1, qStart))
	require.Equal(t, stInFlight, a1.state)
	require.True(t, a1.ackLost, "the consumer acked it: not a failure if its stream ends now")
	require.Equal(t, 1, q.inFlightAt(s))

	require.True(t, q.beginAck(a2), "a late ack of a queued message")
	require.True(t, q.beginAck(a1))
	require.True(t, q.ackDone(a1, qStart))
	require.Equal(t, stAcking, a2.state, "a2 is first now, and acking")
	require.True(t, q.ackFailed(a2, qStart))
	require.Equal(t, stReady, a2.state)
	require.False(t, a2.ackLost, "at no subscriber: it waits again")

	require.True(t, q.deliver(a2, s, qStart, qStart.Add(time.Minute)))
	require.True(t, q.beginAck(a2))
	require.True(t, q.ackFailed(a2, qStart))
	require.True(t, a2.ackLost)
	require.True(t, q.handBack(a2, qStart))
	require.True(t, q.deliver(a2, s, qStart, qStart.Add(time.Minute)))
	require.False(t, a2.ackLost, "a new delivery: not acked yet")
}

func TestQueueSubscriberLeaves(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	a1, b1, c1 := logEntry(1, "a", 0), logEntry(2, "b", 0), logEntry(3, "c", 0)
	for _, e := range []*entry{a1, b1, c1} {
		require.True(t, q.admit(e, qStart))
		require.True(t, q.deliver(e, s, qStart, qStart.Add(time.Minute)))
	}
	require.True(t, q.beginAck(c1))
	require.False(t, q.leave(s), "deliveries in flight")
	require.Equal(t, []*entry{a1, b1}, q.handedTo(s))
	require.True(t, q.handBack(a1, qStart))
	require.True(t, q.beginFail(b1))
	require.True(t, q.leave(s))
	require.Equal(t, "m1:ready m2:failing m3:acking", states(a1, b1, c1))
	require.Nil(t, c1.sub)
	require.Zero(t, q.inFlightTotal())
	require.True(t, q.ackFailed(c1, qStart))
	require.Equal(t, stReady, c1.state, "its subscriber left: it waits again")
}

func TestQueueDropBelow(t *testing.T) {
	q := newDeliveryQueue()
	s := newSubscriber(10)
	a1, a2, a3, u4 := logEntry(1, "a", 1), logEntry(2, "a", 1), logEntry(3, "a", 1), logEntry(4, "", 1)
	r := redrivenEntry(logEntry(0, "r", 1).msg)
	for _, e := range []*entry{a1, a2, a3, u4, r} {
		require.True(t, q.admit(e, qStart))
	}
	require.True(t, q.deliver(a1, s, qStart, qStart.Add(time.Minute)))
	q.dropBelow(4, qStart)
	require.Equal(t, "m1:in flight m2:gone m3:gone m4:ready m0:ready", states(a1, a2, a3, u4, r))
	require.Equal(t, 3, q.count())
	require.Equal(t, []*entry{a1}, q.keys["a"])
}

// ---- the random walk against a model ----

// mstate is what the model knows of a message.
type mstate int

const (
	mWaiting mstate = iota
	mInFlight
	mAcking
	mFailing
)

type mmsg struct {
	e         *entry
	st        mstate
	sub       *subscriber // in flight there, or acking from there
	handed    bool        // acking since it was in flight
	deadline  time.Time
	notBefore time.Time
}

// queueModel is what the queue must do: per ordering key the messages in the
// order they go (commit order, a redriven dead letter before those still
// waiting), the held keys, and where each message is.
type queueModel struct {
	msgs  map[entryKey]*mmsg
	order map[string][]entryKey
	held  map[string]bool
	dlq   []*storepb.Message
	// before[r] are the messages a redriven r must go before until it is
	// handed out: those of its key waiting behind it when it came in.
	before map[entryKey]map[entryKey]bool
}

func (m *queueModel) admit(mm *mmsg) {
	e := mm.e
	m.msgs[e.key] = mm
	k := e.msg.OrderingKey
	if k == "" {
		return
	}
	o := m.order[k]
	i := len(o)
	if e.key.redriven {
		// After what is being handled and the redriven ones before it.
		i = 0
		for j, x := range o {
			if m.msgs[x].st != mWaiting || (x.redriven && x.seq < e.key.seq) {
				i = j + 1
			}
		}
		m.before[e.key] = map[entryKey]bool{}
		for _, x := range o[i:] {
			m.before[e.key][x] = true
		}
	}
	m.order[k] = slices.Insert(o, i, e.key)
}

func (m *queueModel) remove(k entryKey) {
	mm := m.msgs[k]
	delete(m.msgs, k)
	delete(m.before, k)
	if key := mm.e.msg.OrderingKey; key != "" {
		m.order[key] = slices.DeleteFunc(m.order[key], func(x entryKey) bool { return x == k })
		if len(m.order[key]) == 0 {
			delete(m.order, key)
		}
	}
}

// busy: handed out and not settled.
func (mm *mmsg) busy() bool {
	return mm.st == mInFlight || mm.st == mFailing || (mm.st == mAcking && mm.handed)
}

type walk struct {
	t    *testing.T
	rng  *rand.Rand
	q    *deliveryQueue
	m    *queueModel
	now  time.Time
	hold bool
	subs []*subscriber
	seq  uint64 // last log sequence admitted
}

func TestQueueRandomWalk(t *testing.T) {
	const seeds, steps = 24, 2500
	total := map[string]int{}
	for seed := uint64(1); seed <= seeds; seed++ {
		w := &walk{t: t, rng: rand.New(rand.NewPCG(seed, 42)), q: newDeliveryQueue(), now: qStart, hold: seed%2 == 0,
			m: &queueModel{msgs: map[entryKey]*mmsg{}, order: map[string][]entryKey{}, held: map[string]bool{},
				before: map[entryKey]map[entryKey]bool{}}}
		for range 3 {
			w.subs = append(w.subs, newSubscriber(1+w.rng.IntN(4)))
		}
		for i := 0; i < steps; i++ {
			name := w.step()
			total[name]++
			if err := w.check(); err != nil {
				t.Fatalf("seed %d step %d (%s): %v", seed, i, name, err)
			}
		}
	}
	t.Logf("%d seeds x %d steps: %v", seeds, steps, total)
	for _, name := range []string{"admit", "redrive", "deliver", "ack", "ack done", "ack failed", "nack", "retry",
		"dead letter", "expire", "advance", "hold", "unhold", "leave", "drop", "extend", "refused"} {
		require.Positive(t, total[name], "the walk never did %q", name)
	}
}

func (w *walk) step() string {
	r := w.rng.IntN(100)
	switch {
	case r < 14:
		return w.admit()
	case r < 18:
		return w.redrive()
	case r < 38:
		return w.deliver()
	case r < 46:
		return w.ack()
	case r < 56:
		return w.settleAck()
	case r < 61:
		return w.nack()
	case r < 71:
		return w.settleFailure()
	case r < 75:
		return w.expire()
	case r < 83:
		return w.advance()
	case r < 85:
		k := w.key()
		if k != "" {
			w.q.hold(k)
			w.m.held[k] = true
		}
		return "hold"
	case r < 88:
		keep := map[string]bool{}
		for k := range w.m.held {
			if w.rng.IntN(2) == 0 {
				keep[k] = true
			}
		}
		w.q.unholdExcept(keep, w.now)
		w.m.held = keep
		return "unhold"
	case r < 90:
		return w.leave()
	case r < 91:
		return w.drop()
	case r < 94:
		return w.extend()
	default:
		return w.refuse()
	}
}

// advance moves the clock, to the next deadline or end of a delay (the
// edge where a transition is due) or by a random step.
func (w *walk) advance() string {
	next := w.now.Add(time.Duration(w.rng.IntN(1500)) * time.Millisecond)
	if w.rng.IntN(3) == 0 {
		for _, mm := range w.m.msgs {
			at := map[mstate]time.Time{mInFlight: mm.deadline, mWaiting: mm.notBefore}[mm.st]
			if at.After(w.now) && at.Before(next) {
				next = at
			}
		}
	}
	w.now = next
	w.q.releaseDue(w.now)
	return "advance"
}

func (w *walk) key() string {
	return []string{"", "a", "b", "c", "d"}[w.rng.IntN(5)]
}

// pick returns a random message of the queueModel in one of the states, nil
// when there is none.
func (w *walk) pick(sts ...mstate) *mmsg {
	var cands []*mmsg
	for _, mm := range w.m.msgs {
		if slices.Contains(sts, mm.st) {
			cands = append(cands, mm)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	slices.SortFunc(cands, func(a, b *mmsg) int { return byOrder(a.e, b.e) })
	return cands[w.rng.IntN(len(cands))]
}

func (w *walk) admit() string {
	if len(w.m.msgs) > 40 {
		return "full"
	}
	w.seq++
	e := logEntry(w.seq, w.key(), w.rng.IntN(100))
	if w.rng.IntN(5) == 0 {
		// Failed before (a previous leader recorded it).
		e.attempts = uint32(1 + w.rng.IntN(3))
		e.retryAt = w.now.Add(time.Duration(w.rng.IntN(6000)-1000) * time.Millisecond)
	}
	require.True(w.t, w.q.admit(e, w.now))
	w.m.admit(&mmsg{e: e, notBefore: e.retryAt})
	return "admit"
}

func (w *walk) redrive() string {
	if len(w.m.dlq) == 0 {
		return "no dead letter"
	}
	i := w.rng.IntN(len(w.m.dlq))
	msg := w.m.dlq[i]
	w.m.dlq = slices.Delete(w.m.dlq, i, i+1)
	e := redrivenEntry(msg)
	require.True(w.t, w.q.admit(e, w.now))
	w.m.admit(&mmsg{e: e})
	return "redrive"
}

// deliver hands out what the queue offers and checks it is what the queueModel
// allows.
func (w *walk) deliver() string {
	s := w.subs[w.rng.IntN(len(w.subs))]
	e := w.q.nextReady()
	if e == nil {
		return "nothing ready"
	}
	if w.q.inFlightAt(s) >= s.max {
		require.False(w.t, w.q.deliver(e, s, w.now, w.now), "the subscriber is full")
		return "refused"
	}
	mm := w.m.msgs[e.key]
	require.NotNil(w.t, mm, "handed out %s, which the queueModel does not hold", e.msg.Id)
	require.Equal(w.t, mWaiting, mm.st, "handed out %s", e.msg.Id)
	require.False(w.t, mm.notBefore.After(w.now), "%s handed out before its time", e.msg.Id)
	if k := e.msg.OrderingKey; k != "" {
		require.False(w.t, w.m.held[k], "%s handed out while its key %s is held", e.msg.Id, k)
		require.Equal(w.t, e.key, w.m.order[k][0], "%s handed out before an earlier message of its key", e.msg.Id)
		for _, x := range w.m.order[k] {
			require.False(w.t, w.m.msgs[x].busy(), "%s handed out while %d of its key is on its way", e.msg.Id, x.seq)
		}
		for r, before := range w.m.before {
			require.False(w.t, before[e.key], "%s handed out before the redriven %d", e.msg.Id, r.seq)
		}
	}
	delete(w.m.before, e.key)
	deadline := w.now.Add(time.Duration(1+w.rng.IntN(3)) * time.Second)
	require.True(w.t, w.q.deliver(e, s, w.now, deadline))
	mm.st, mm.sub, mm.deadline = mInFlight, s, deadline
	return "deliver"
}

func (w *walk) ack() string {
	mm := w.pick(mWaiting, mInFlight)
	if mm == nil {
		return "nothing to ack"
	}
	require.True(w.t, w.q.beginAck(mm.e))
	mm.handed = mm.st == mInFlight
	mm.st = mAcking
	delete(w.m.before, mm.e.key)
	return "ack"
}

func (w *walk) settleAck() string {
	mm := w.pick(mAcking)
	if mm == nil {
		return "no ack"
	}
	if w.rng.IntN(4) == 0 {
		require.True(w.t, w.q.ackFailed(mm.e, w.now))
		mm.st = mWaiting
		if mm.sub != nil {
			mm.st = mInFlight
		}
		return "ack failed"
	}
	require.True(w.t, w.q.ackDone(mm.e, w.now))
	require.Equal(w.t, stGone, mm.e.state)
	w.m.remove(mm.e.key)
	return "ack done"
}

func (w *walk) nack() string {
	mm := w.pick(mInFlight)
	if mm == nil {
		return "nothing in flight"
	}
	require.True(w.t, w.q.beginFail(mm.e))
	mm.st, mm.sub = mFailing, nil
	return "nack"
}

func (w *walk) settleFailure() string {
	mm := w.pick(mFailing)
	if mm == nil {
		return "no failure"
	}
	if w.rng.IntN(3) == 0 {
		require.True(w.t, w.q.deadLettered(mm.e, w.hold, w.now))
		require.Equal(w.t, stGone, mm.e.state)
		if k := mm.e.msg.OrderingKey; k != "" && w.hold {
			w.m.held[k] = true
		}
		w.m.remove(mm.e.key)
		w.m.dlq = append(w.m.dlq, mm.e.msg)
		return "dead letter"
	}
	retryAt := w.now.Add(time.Duration(w.rng.IntN(3000)) * time.Millisecond)
	require.True(w.t, w.q.retry(mm.e, retryAt, "boom", w.now))
	mm.st, mm.notBefore = mWaiting, retryAt
	return "retry"
}

func (w *walk) expire() string {
	var want []*entry
	for _, mm := range w.m.msgs {
		if mm.st == mInFlight && !w.now.Before(mm.deadline) {
			want = append(want, mm.e)
		}
	}
	slices.SortFunc(want, byOrder)
	got := w.q.expire(w.now)
	require.Equal(w.t, len(want), len(got), "expired")
	for i := range want {
		require.Same(w.t, want[i], got[i])
		mm := w.m.msgs[got[i].key]
		mm.st, mm.sub = mFailing, nil
	}
	return "expire"
}

// leave takes a subscriber out, its stream closed cleanly or broken, and
// puts a new one in.
func (w *walk) leave() string {
	i := w.rng.IntN(len(w.subs))
	s := w.subs[i]
	clean := w.rng.IntN(2) == 0
	var want []*entry
	for _, mm := range w.m.msgs {
		if mm.st == mInFlight && mm.sub == s {
			want = append(want, mm.e)
		}
	}
	slices.SortFunc(want, byOrder)
	require.Equal(w.t, want, w.q.handedTo(s))
	if len(want) > 0 {
		require.False(w.t, w.q.leave(s), "deliveries in flight")
	}
	for _, e := range want {
		mm := w.m.msgs[e.key]
		if clean {
			require.True(w.t, w.q.handBack(e, w.now))
			mm.st = mWaiting
		} else {
			require.True(w.t, w.q.beginFail(e))
			mm.st = mFailing
		}
		mm.sub = nil
	}
	require.True(w.t, w.q.leave(s))
	for _, mm := range w.m.msgs {
		if mm.sub == s {
			mm.sub = nil
		}
	}
	w.subs[i] = newSubscriber(1 + w.rng.IntN(4))
	return "leave"
}

func (w *walk) drop() string {
	first := 1 + uint64(w.rng.IntN(int(w.seq)+1))
	w.q.dropBelow(first, w.now)
	for k, mm := range w.m.msgs {
		if !k.redriven && k.seq < first && mm.st == mWaiting {
			require.Equal(w.t, stGone, mm.e.state)
			w.m.remove(k)
		}
	}
	return "drop"
}

func (w *walk) extend() string {
	mm := w.pick(mInFlight)
	if mm == nil {
		return "nothing in flight"
	}
	mm.deadline = w.now.Add(time.Duration(1+w.rng.IntN(3)) * time.Second)
	require.True(w.t, w.q.extend(mm.e, mm.deadline))
	return "extend"
}

// refuse tries a transition from a state it does not start from: it must
// change nothing, which the next check confirms.
func (w *walk) refuse() string {
	mm := w.pick(mWaiting, mInFlight, mAcking, mFailing)
	if mm == nil {
		return "empty"
	}
	e := mm.e
	switch mm.st {
	case mWaiting:
		require.False(w.t, w.q.beginFail(e))
		require.False(w.t, w.q.handBack(e, w.now))
		require.False(w.t, w.q.extend(e, w.now))
		require.False(w.t, w.q.ackDone(e, w.now))
	case mInFlight:
		require.False(w.t, w.q.deliver(e, w.subs[0], w.now, w.now))
		require.False(w.t, w.q.retry(e, w.now, "", w.now))
		require.False(w.t, w.q.ackFailed(e, w.now))
	case mAcking:
		require.False(w.t, w.q.beginAck(e))
		require.False(w.t, w.q.beginFail(e))
		require.False(w.t, w.q.deadLettered(e, true, w.now))
	case mFailing:
		require.False(w.t, w.q.beginAck(e))
		require.False(w.t, w.q.handBack(e, w.now))
		require.False(w.t, w.q.ackDone(e, w.now))
	}
	require.False(w.t, w.q.admit(&entry{key: e.key, msg: e.msg}, w.now), "a key the queue holds")
	return "refused"
}

// check compares the queue with the queueModel, and the queue with itself.
func (w *walk) check() error {
	q, m := w.q, w.m
	if len(q.entries) != len(m.msgs) || len(q.byID) != len(m.msgs) {
		return fmt.Errorf("queue holds %d entries (%d IDs), the queueModel %d", len(q.entries), len(q.byID), len(m.msgs))
	}
	inHeap := map[*entry]entryState{}
	for _, e := range q.ready.es {
		inHeap[e] = stReady
	}
	for _, e := range q.delayed.es {
		if _, twice := inHeap[e]; twice {
			return fmt.Errorf("%s is ready and delayed", e.msg.Id)
		}
		inHeap[e] = stDelayed
	}
	if len(inHeap) != len(q.ready.es)+len(q.delayed.es) {
		return fmt.Errorf("an entry is twice in a heap")
	}
	if top := q.ready.top(); top != nil {
		for _, e := range q.ready.es {
			if less(e, top) {
				return fmt.Errorf("%s is ready before %s, which goes next", e.msg.Id, top.msg.Id)
			}
		}
	}
	bytes, perSub := 0, map[*subscriber]int{}
	for k, mm := range m.msgs {
		e := q.entries[k]
		if e != mm.e || q.byID[e.msg.Id] != e {
			return fmt.Errorf("%s: the queue holds another entry", mm.e.msg.Id)
		}
		bytes += len(e.msg.Body)
		if mm.sub != nil {
			perSub[mm.sub]++
		}
		if st, ok := inHeap[e]; (ok || e.state == stReady || e.state == stDelayed) && st != e.state {
			return fmt.Errorf("%s is %s but in the %s heap", e.msg.Id, stateNames[e.state], stateNames[st])
		}
		if err := w.checkState(mm); err != nil {
			return err
		}
	}
	if bytes != q.size() {
		return fmt.Errorf("queue counts %d bytes, the messages hold %d", q.size(), bytes)
	}
	total := 0
	for _, s := range w.subs {
		if n := q.inFlightAt(s); n != perSub[s] || n > s.max {
			return fmt.Errorf("a subscriber (max %d) has %d in flight in the queue, %d in the queueModel", s.max, n, perSub[s])
		}
		total += perSub[s]
	}
	if q.inFlightTotal() != total || len(q.subs) > len(w.subs) {
		return fmt.Errorf("%d in flight in the queue, %d in the queueModel", q.inFlightTotal(), total)
	}
	return w.checkKeys()
}

// checkState checks one entry's state against the queueModel: a waiting one is
// ready or delayed exactly when it may go (first of its key, key not held),
// delayed exactly while its time has not come.
func (w *walk) checkState(mm *mmsg) error {
	e := mm.e
	want := map[mstate]entryState{mInFlight: stInFlight, mAcking: stAcking, mFailing: stFailing}[mm.st]
	if mm.st == mWaiting {
		k := e.msg.OrderingKey
		want = stQueued
		if k == "" || (!w.m.held[k] && w.m.order[k][0] == e.key) {
			want = stReady
			if mm.notBefore.After(w.now) {
				want = stDelayed
			}
		}
	}
	switch {
	case e.state != want:
		return fmt.Errorf("%s is %s, want %s", e.msg.Id, stateNames[e.state], stateNames[want])
	case e.sub != mm.sub:
		return fmt.Errorf("%s is at another subscriber", e.msg.Id)
	case mm.st == mInFlight && !e.deadline.Equal(mm.deadline):
		return fmt.Errorf("%s has deadline %s, want %s", e.msg.Id, e.deadline, mm.deadline)
	case e.sub != nil && !contains(w.q.subs[e.sub], e):
		return fmt.Errorf("%s is not counted at its subscriber", e.msg.Id)
	}
	return nil
}

func contains(es map[*entry]struct{}, e *entry) bool {
	_, ok := es[e]
	return ok
}

// checkKeys compares each ordering key's list with the queueModel's, and
// checks a key has at most one message on its way.
func (w *walk) checkKeys() error {
	if len(w.q.keys) != len(w.m.order) {
		return fmt.Errorf("queue has %d ordering keys, the queueModel %d", len(w.q.keys), len(w.m.order))
	}
	for k, o := range w.m.order {
		var got []entryKey
		busy := 0
		for _, e := range w.q.keys[k] {
			got = append(got, e.key)
			if w.m.msgs[e.key].busy() {
				busy++
			}
		}
		if !slices.Equal(got, o) {
			return fmt.Errorf("key %s: queue order %v, queueModel %v", k, got, o)
		}
		if busy > 1 {
			return fmt.Errorf("key %s: %d messages on their way", k, busy)
		}
	}
	return nil
}
