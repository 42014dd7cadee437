package raftlog

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// batchOf is the entry the batcher builds for cmds.
func batchOf(t *testing.T, cmds ...*raftpb.Command) *raftpb.Command {
	t.Helper()
	ps := make([]*proposal, len(cmds))
	for i, c := range cmds {
		data, err := proto.Marshal(c)
		require.NoError(t, err)
		ps[i] = &proposal{data: data}
	}
	out := &raftpb.Command{}
	require.NoError(t, proto.Unmarshal(encodeBatch(ps), out))
	return out
}

// The batch encoding is the Command a Batch message encodes to.
func TestEncodeBatch(t *testing.T) {
	cmds := []*raftpb.Command{sendHalf("orders", "m1", "shop", "tx1", 1), resolveCmd("m1", raftpb.Resolution_RESOLUTION_COMMIT, 2)}
	want := &raftpb.Command{Op: &raftpb.Command_Batch{Batch: &raftpb.Batch{Commands: cmds}}}
	require.True(t, proto.Equal(want, batchOf(t, cmds...)))
}

// A batch whose commands partly fail answers each with its own result,
// and changes the store exactly as the commands one by one would.
func TestBatchAnswersEachCommand(t *testing.T) {
	cmds := []*raftpb.Command{
		sendHalf("orders", "m1", "shop", "tx1", 1*ns),
		resolveCmd("m1", raftpb.Resolution_RESOLUTION_COMMIT, 2*ns),
		resolveCmd("m1", raftpb.Resolution_RESOLUTION_ROLLBACK, 3*ns),    // refused: first resolution wins
		sendHalf("orders", "m2", "shop", "tx1", 4*ns),                    // a repeat of tx1
		{Now: 5 * ns, Op: &raftpb.Command_Batch{Batch: &raftpb.Batch{}}}, // refused: no batch in a batch
		sendCmd(6*ns, "m3", ""),
		// state() compares these groups.
		cmdAt(7*ns, &raftpb.CreateGroup{Topic: "orders", Group: "g"}),
		cmdAt(7*ns, &raftpb.CreateGroup{Topic: "orders", Group: "h"}),
	}
	batched := newTestFSM(t)
	out := batched.f.ApplyBatch(logsOf(t, 1, []*raftpb.Command{batchOf(t, cmds...)}))
	got, ok := out[0].([]applied)
	require.True(t, ok, "a batch entry answers %T", out[0])
	require.Len(t, got, len(cmds))
	require.Equal(t, []Event{{Kind: EventAppended, Topic: "orders"}}, batched.events)

	one := newTestFSM(t)
	for i, c := range cmds {
		if c.GetBatch() != nil {
			continue
		}
		want, _ := one.apply(t, c)
		if want[0].err != nil {
			require.Error(t, got[i].err, "command %d", i)
			require.Equal(t, want[0].err.Error(), got[i].err.Error(), "command %d", i)
			continue
		}
		require.NoError(t, got[i].err, "command %d", i)
		require.Equal(t, fmt.Sprint(want[0].result), fmt.Sprint(got[i].result), "command %d", i)
	}
	require.ErrorIs(t, got[2].err, halfstore.ErrConflict)
	require.ErrorIs(t, got[4].err, ErrUnknownCommand)
	require.False(t, got[3].result.(HalfResult).Changed, "the repeat finds the first message")
	a, b := state(t, one.store), state(t, batched.store)
	require.Equal(t, len(a), len(b))
	for i := range a {
		require.True(t, proto.Equal(a[i], b[i]), "record %d: %v vs %v", i, a[i], b[i])
	}

	res := batched.f.ApplyBatch(logsOf(t, 1, []*raftpb.Command{batchOf(t, cmds...)}))
	require.Equal(t, []interface{}{nil}, res, "a replayed batch applies nothing")
}

// regroupBatcher is a batcher of a node that exists only for regroup: its
// Config.Regroup and its shutdown channel. Proposals reach it through in,
// which holds up to 8 unread.
func regroupBatcher(regroup time.Duration) *batcher {
	return &batcher{n: &Node{cfg: Config{Regroup: regroup}, shutdown: make(chan struct{})}, in: make(chan *proposal, 8)}
}

// writer is a proposal made at at, waiting for company (a consumer's ack)
// or not.
func writer(at time.Time, mayWait bool) *proposal {
	p := &proposal{at: at}
	if mayWait {
		p.linger = time.Minute
	}
	return p
}

// regroupOf runs regroup after an entry that answered writes made
// without a Writer at at, and says how long it took.
func regroupOf(b *batcher, writes int, at time.Time, pending []*proposal) ([]*proposal, bool, time.Duration) {
	return regroupAfter(b, &answered{writers: writes, by: map[*Writer]int{nil: writes}, at: at}, pending)
}

// regroupAfter runs regroup after the entry a tells of, and says how long
// it took.
func regroupAfter(b *batcher, a *answered, pending []*proposal) ([]*proposal, bool, time.Duration) {
	b.answered.Store(a)
	start := time.Now()
	out, ok := b.regroup(pending)
	return out, ok, time.Since(start)
}

// writerOf is w's proposal, made at at, that does not wait for company.
func writerOf(w *Writer, at time.Time) *proposal {
	p := writer(at, false)
	p.writer = w
	return p
}

// The wait is for the writers the entry answered, each as many times as
// it had writes there: others' writes, and a writer's beyond its own
// count, do not end it.
func TestRegroupWaitsForTheWritersItAnswered(t *testing.T) {
	b := regroupBatcher(time.Minute)
	x, y, other := new(Writer), new(Writer), new(Writer)
	answeredAt := time.Now().Add(-time.Millisecond)
	a := &answered{writers: 4, by: map[*Writer]int{x: 1, y: 2, nil: 1}, at: answeredAt}
	xBack := writerOf(x, answeredAt.Add(time.Microsecond))
	sent := make(chan struct{})
	var last *proposal
	go func() {
		defer close(sent)
		for _, w := range []*Writer{other, x, other, y, nil} {
			b.in <- writerOf(w, time.Now())
		}
		last = writerOf(y, time.Now())
		b.in <- last
	}()
	out, ok, _ := regroupAfter(b, a, []*proposal{xBack})
	require.True(t, ok)
	<-sent
	require.Len(t, out, 7, "x back before the wait, then the others' two, x again, y, the writer-less one and y")
	require.Same(t, last, out[6], "the wait ended with y's second write")
	require.Equal(t, 0, b.skip)
}

// Writes that come at a steady rate from writers the entry did not answer
// do not end the wait: it runs out, and the next entry goes without one.
func TestRegroupIsNotEndedByOthersWrites(t *testing.T) {
	const wait = 100 * time.Millisecond
	b := regroupBatcher(wait)
	x, y := new(Writer), new(Writer)
	answeredAt := time.Now()
	a := &answered{writers: 2, by: map[*Writer]int{x: 1, y: 1}, at: answeredAt}
	stop := make(chan struct{})
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			select {
			case b.in <- writerOf(new(Writer), time.Now()):
			case <-stop:
				return
			}
		}
	}()
	_, ok, _ := regroupAfter(b, a, nil)
	close(stop)
	<-sent
	require.True(t, ok)
	require.GreaterOrEqual(t, time.Since(answeredAt), wait, "others' writes ended the wait")
	require.Equal(t, 1, b.skip, "a wait that ran out")
}

// The next entry waits for as many writers as the last one answered:
// those already back count, and so do those that come; an ack does not,
// and neither does a proposal made before the answers.
func TestRegroupWaitsForTheAnsweredWriters(t *testing.T) {
	b := regroupBatcher(time.Minute)
	answeredAt := time.Now().Add(-time.Millisecond)
	before := writer(answeredAt.Add(-time.Millisecond), false)
	back := writer(answeredAt.Add(time.Microsecond), false)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		b.in <- writer(time.Now(), true)
		b.in <- writer(time.Now(), false)
		b.in <- writer(time.Now(), false)
	}()
	out, ok, _ := regroupOf(b, 3, answeredAt, []*proposal{before, back})
	require.True(t, ok)
	<-sent
	require.Len(t, out, 5, "the two pending, the ack and the two writers that came back")
	require.Same(t, before, out[0])
	require.Same(t, back, out[1])
	require.Equal(t, 0, b.skip)
}

// A lone writer, an entry of acks only, and a batcher told never to wait
// go at once.
func TestRegroupDoesNotWait(t *testing.T) {
	for _, c := range []struct {
		name    string
		regroup time.Duration
		writers int
	}{
		{"one writer", time.Minute, 1},
		{"no writer", time.Minute, 0},
		{"never", -1, 16},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := regroupBatcher(c.regroup)
			pending := []*proposal{writer(time.Now(), false)}
			out, ok, _ := regroupOf(b, c.writers, time.Now().Add(-time.Second), pending)
			require.True(t, ok)
			require.Equal(t, pending, out)
		})
	}
	b := regroupBatcher(time.Minute)
	pending := []*proposal{writer(time.Now(), false)}
	out, ok := b.regroup(pending)
	require.True(t, ok, "no entry answered yet")
	require.Equal(t, pending, out)
}

// A wait that runs out (Config.Regroup after the answers) makes the next
// entries go without one: 1, then 2, then 4 of them, even when some of
// the writers came back. One in which all came back halves that.
func TestRegroupBacksOffWhenWritersDoNotComeBack(t *testing.T) {
	const wait = 200 * time.Millisecond
	b := regroupBatcher(wait)
	pending := []*proposal{writer(time.Now(), false)}
	// comeBack runs regroup after an entry that answered 4 writers, n of
	// whom have written again, and says how long after the answers it
	// ended.
	comeBack := func(n int) (out []*proposal, ended time.Duration) {
		t.Helper()
		answeredAt := time.Now().Add(-time.Millisecond)
		for range n {
			b.in <- writer(time.Now(), false)
		}
		out, ok, _ := regroupOf(b, 4, answeredAt, pending)
		require.True(t, ok)
		require.Len(t, out, len(pending)+n)
		return out, time.Since(answeredAt)
	}
	timedOut := func(n int) {
		t.Helper()
		_, ended := comeBack(n)
		require.GreaterOrEqual(t, ended, wait)
	}
	skipped := func(n int) {
		t.Helper()
		for range n {
			out, ok, took := regroupOf(b, 4, time.Now(), pending)
			require.True(t, ok)
			require.Equal(t, pending, out)
			require.Less(t, took, wait, "a skipped entry waited")
		}
	}
	timedOut(0)
	skipped(1)
	timedOut(3)
	skipped(2)
	timedOut(2)
	skipped(4)

	// All four come back: the wait ends with them, and the back-off
	// halves, twice to 1, then to none.
	b.n.cfg.Regroup = time.Minute
	for _, want := range []int{2, 1, 0} {
		comeBack(4)
		require.Equal(t, 0, b.skip)
		require.Equal(t, want, b.backoff)
	}
	b.n.cfg.Regroup = wait
	timedOut(1)
	require.Equal(t, 1, b.skip, "the back-off starts again from 1")

	b.skip, b.backoff = 0, maxRegroupBackoff
	timedOut(0)
	require.Equal(t, maxRegroupBackoff, b.skip, "the back-off is bounded")
}

// The wait ends Config.Regroup after the answers, however late it
// starts; a write that comes after that goes at once and leaves the
// back-off as it was: it is a write after a pause, not a writer late.
func TestRegroupWaitsFromTheAnswers(t *testing.T) {
	const wait = 400 * time.Millisecond
	b := regroupBatcher(wait)
	pending := []*proposal{writer(time.Now(), false)}
	answeredAt := time.Now().Add(-wait / 2)
	out, ok, took := regroupOf(b, 4, answeredAt, pending)
	require.True(t, ok)
	require.Equal(t, pending, out)
	require.GreaterOrEqual(t, time.Since(answeredAt), wait)
	require.Less(t, took, wait, "the wait started again when regroup was called")
	require.Equal(t, 1, b.skip, "a wait that ran out")

	b.skip, b.backoff = 2, 2
	out, ok, took = regroupOf(b, 4, time.Now().Add(-2*wait), pending)
	require.True(t, ok)
	require.Equal(t, pending, out)
	require.Less(t, took, wait/2, "a write after a pause waited")
	require.Equal(t, 2, b.skip, "a write after a pause took one of the skipped entries")
	require.Equal(t, 2, b.backoff)
}

// A node that shuts down ends the wait.
func TestRegroupEndsOnShutdown(t *testing.T) {
	b := regroupBatcher(time.Minute)
	done := make(chan bool, 1)
	go func() {
		_, ok, _ := regroupOf(b, 2, time.Now(), []*proposal{writer(time.Now(), false)})
		done <- ok
	}()
	close(b.n.shutdown)
	select {
	case ok := <-done:
		require.False(t, ok)
	case <-time.After(10 * time.Second):
		t.Fatal("regroup went on waiting after shutdown")
	}
}
