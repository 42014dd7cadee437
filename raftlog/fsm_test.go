package raftlog

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// testFSM drives the FSM directly, without Raft: each apply is one batch
// of entries with the next indexes.
type testFSM struct {
	f      *fsm
	store  *halfstore.Store
	next   uint64
	events []Event
	// resolved are the EventResolved events, kept apart from events.
	resolved []Event
}

func newTestFSM(t *testing.T) *testFSM {
	t.Helper()
	store, err := halfstore.Open(filepath.Join(t.TempDir(), "fsm.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	tf := &testFSM{store: store, next: 1}
	tf.f = newFSM(store, slog.New(slog.NewTextHandler(io.Discard, nil)), func(evs []Event) {
		for _, ev := range evs {
			if ev.Kind == EventResolved {
				tf.resolved = append(tf.resolved, ev)
				continue
			}
			tf.events = append(tf.events, ev)
		}
	}, Hooks{}, nil, nil)
	return tf
}

func logsOf(t *testing.T, from uint64, cmds []*raftpb.Command) []*raft.Log {
	t.Helper()
	logs := make([]*raft.Log, len(cmds))
	for i, cmd := range cmds {
		b, err := proto.Marshal(cmd)
		require.NoError(t, err)
		logs[i] = &raft.Log{Index: from + uint64(i), Type: raft.LogCommand, Data: b}
	}
	return logs
}

// apply applies cmds as one batch and returns what each gave and the
// events the batch reported.
func (tf *testFSM) apply(t *testing.T, cmds ...*raftpb.Command) ([]applied, []Event) {
	t.Helper()
	logs := logsOf(t, tf.next, cmds)
	tf.next += uint64(len(cmds))
	tf.events, tf.resolved = nil, nil
	out := tf.f.ApplyBatch(logs)
	rs := make([]applied, len(out))
	for i, r := range out {
		rs[i] = r.(applied)
	}
	return rs, tf.events
}

// one applies a single command that must not be refused and returns its
// result as R.
func one[R any](t *testing.T, tf *testFSM, cmd *raftpb.Command) (R, []Event) {
	t.Helper()
	rs, evs := tf.apply(t, cmd)
	require.NoError(t, rs[0].err)
	r, ok := rs[0].result.(R)
	require.True(t, ok, "result is a %T", rs[0].result)
	return r, evs
}

const ns = int64(time.Second)

func cmdAt(now int64, op any) *raftpb.Command {
	c := &raftpb.Command{Now: now}
	switch o := op.(type) {
	case *raftpb.Send:
		c.Op = &raftpb.Command_Send{Send: o}
	case *raftpb.CreateGroup:
		c.Op = &raftpb.Command_CreateGroup{CreateGroup: o}
	case *raftpb.Ack:
		c.Op = &raftpb.Command_Ack{Ack: o}
	case *raftpb.RecordFailures:
		c.Op = &raftpb.Command_RecordFailures{RecordFailures: o}
	case *raftpb.SetConsumerGroup:
		c.Op = &raftpb.Command_SetConsumerGroup{SetConsumerGroup: o}
	case *raftpb.SetProducerGroup:
		c.Op = &raftpb.Command_SetProducerGroup{SetProducerGroup: o}
	case *raftpb.ResetGroup:
		c.Op = &raftpb.Command_ResetGroup{ResetGroup: o}
	case *raftpb.Redrive:
		c.Op = &raftpb.Command_Redrive{Redrive: o}
	case *raftpb.PurgeDeadLetters:
		c.Op = &raftpb.Command_PurgeDeadLetters{PurgeDeadLetters: o}
	case *raftpb.Trim:
		c.Op = &raftpb.Command_Trim{Trim: o}
	case *raftpb.Prune:
		c.Op = &raftpb.Command_Prune{Prune: o}
	case *raftpb.SendHalf:
		c.Op = &raftpb.Command_SendHalf{SendHalf: o}
	case *raftpb.Resolve:
		c.Op = &raftpb.Command_Resolve{Resolve: o}
	case *raftpb.Expire:
		c.Op = &raftpb.Command_Expire{Expire: o}
	case *raftpb.RecordCheck:
		c.Op = &raftpb.Command_RecordCheck{RecordCheck: o}
	case *raftpb.DeleteTopic:
		c.Op = &raftpb.Command_DeleteTopic{DeleteTopic: o}
	case *raftpb.DeleteGroup:
		c.Op = &raftpb.Command_DeleteGroup{DeleteGroup: o}
	default:
		panic("cmdAt: unknown op")
	}
	return c
}

func sendHalf(topic, id, group, tx string, now int64) *raftpb.Command {
	return cmdAt(now, &raftpb.SendHalf{
		Topic: topic, MessageId: id, ProducerGroup: group, TransactionId: tx,
		Body: []byte("body-" + tx), CreateTopic: true, CheckAfter: 6 * ns,
	})
}

func resolveCmd(id string, r raftpb.Resolution, now int64) *raftpb.Command {
	return cmdAt(now, &raftpb.Resolve{MessageId: id, Resolution: r, Source: storepb.Source_SOURCE_PRODUCER})
}

func sendCmd(now int64, id, orderingKey string) *raftpb.Command {
	return cmdAt(now, &raftpb.Send{Topic: "orders", MessageId: id, Key: "dedup-" + id, Body: []byte(id), CreateTopic: true, DedupWindow: 10 * ns, OrderingKey: orderingKey})
}

func seqsOf(dls []*storepb.DeadLetter) []uint64 {
	out := []uint64{}
	for _, dl := range dls {
		out = append(out, dl.GetMessage().GetSequence())
	}
	return out
}

func TestApplyConsumerGroupCommands(t *testing.T) {
	tf := newTestFSM(t)
	rs, evs := tf.apply(t,
		sendCmd(1*ns, "m1", "k1"),
		sendCmd(2*ns, "m2", "k2"),
		sendCmd(3*ns, "m3", "k1"),
		sendCmd(4*ns, "m4", ""),
		cmdAt(5*ns, &raftpb.SendHalf{Topic: "orders", MessageId: "h1", ProducerGroup: "pg", TransactionId: "tx1", CreateTopic: true, CheckAfter: ns, OrderingKey: "k3"}),
		cmdAt(6*ns, &raftpb.Resolve{MessageId: "h1", Resolution: raftpb.Resolution_RESOLUTION_COMMIT, Source: storepb.Source_SOURCE_PRODUCER}),
	)
	for _, r := range rs {
		require.NoError(t, r.err)
	}
	require.Equal(t, []Event{{Kind: EventAppended, Topic: "orders"}}, evs, "one event per topic and kind in a batch")
	require.NoError(t, tf.store.View(func(tx *halfstore.Tx) error {
		ms, err := tx.ReadTopic("orders", 1, 10)
		require.NoError(t, err)
		require.Len(t, ms, 5)
		require.Equal(t, "k1", ms[0].OrderingKey)
		require.Equal(t, "k3", ms[4].OrderingKey, "a half message's ordering key reaches the log")
		return nil
	}))

	// Start positions.
	r, evs := one[GroupResult](t, tf, cmdAt(7*ns, &raftpb.CreateGroup{Topic: "orders", Group: "g", Start: raftpb.StartPosition_START_POSITION_TIMESTAMP, StartTime: 2 * ns}))
	require.True(t, r.Created)
	require.Equal(t, uint64(1), r.Group.AckedThrough)
	require.Empty(t, evs)
	r, _ = one[GroupResult](t, tf, cmdAt(7*ns, &raftpb.CreateGroup{Topic: "orders", Group: "late", Start: raftpb.StartPosition_START_POSITION_LATEST}))
	require.Equal(t, uint64(5), r.Group.AckedThrough)
	r, _ = one[GroupResult](t, tf, cmdAt(7*ns, &raftpb.CreateGroup{Topic: "orders", Group: "early"}))
	require.Equal(t, uint64(0), r.Group.AckedThrough)
	rs, evs = tf.apply(t, cmdAt(7*ns, &raftpb.CreateGroup{Topic: "orders", Group: "bad", Start: raftpb.StartPosition_START_POSITION_TIMESTAMP, StartTime: -1}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrInvalid)
	require.Empty(t, evs)

	// Failures: 2 retries, 3 dies.
	r, evs = one[GroupResult](t, tf, cmdAt(8*ns, &raftpb.RecordFailures{Topic: "orders", Group: "g", Failures: []*raftpb.Failure{
		{Sequence: 2, Attempts: 1, RetryAt: 9 * ns, Error: "boom"},
		{Sequence: 3, Attempts: 16, Error: "poison", Dead: true},
	}}))
	require.Empty(t, evs, "failures wake nobody: the leader's dispatcher made them")
	require.Equal(t, []uint64{3}, seqsOf(r.DeadLetters))
	require.Equal(t, int64(8*ns), r.DeadLetters[0].DeadAt)
	require.Equal(t, uint64(1), r.Group.Retrying)
	require.Equal(t, uint64(1), r.Group.DeadLetters)
	require.Equal(t, uint64(2), r.Group.Redeliveries)
	require.NoError(t, tf.store.View(func(tx *halfstore.Tx) error {
		rt, err := tx.Retry("orders", "g", 2)
		require.NoError(t, err)
		require.Equal(t, uint32(1), rt.Attempts)
		require.Equal(t, int64(9*ns), rt.RetryAt)
		require.Equal(t, "boom", rt.LastError)
		keys, err := tx.DeadLetterKeys("orders", "g")
		require.NoError(t, err)
		require.Equal(t, map[string]bool{"k1": true}, keys)
		return nil
	}))

	// Delivery policy.
	cr, evs := one[ConsumerGroupResult](t, tf, cmdAt(9*ns, &raftpb.SetConsumerGroup{Name: "g", MaxDeliveries: 3, AckDeadline: 5 * ns, RedeliveryBackoff: []int64{ns}, OrderedPoison: 2}))
	require.Equal(t, []Event{{Kind: EventGroupConfig, Group: "g"}}, evs)
	want := &storepb.ConsumerGroup{Name: "g", MaxDeliveries: 3, AckDeadline: 5 * ns, RedeliveryBackoff: []int64{ns}, OrderedPoison: 2}
	require.True(t, proto.Equal(want, cr.Policy), "%v", cr.Policy)
	require.NoError(t, tf.store.View(func(tx *halfstore.Tx) error {
		cg, err := tx.ConsumerGroup("g")
		require.NoError(t, err)
		require.True(t, proto.Equal(want, cg), "%v", cg)
		return nil
	}))
	rs, evs = tf.apply(t, cmdAt(9*ns, &raftpb.SetConsumerGroup{Name: "g", OrderedPoison: 7}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrInvalid)
	require.Empty(t, evs, "no event for a refusal")

	// Redrive, then ack the redriven letter.
	rs, evs = tf.apply(t, cmdAt(10*ns, &raftpb.Redrive{Topic: "orders", Group: "g", Sequences: []uint64{42}}))
	require.NoError(t, rs[0].err)
	require.Empty(t, rs[0].result.(DeadLettersResult).Moved)
	require.Empty(t, evs, "nothing redriven, no event")
	dr, evs := one[DeadLettersResult](t, tf, cmdAt(10*ns, &raftpb.Redrive{Topic: "orders", Group: "g", All: true, Limit: 10}))
	require.Equal(t, []uint64{3}, seqsOf(dr.Moved))
	require.Equal(t, []Event{{Kind: EventRedriven, Topic: "orders", Group: "g"}}, evs)
	rs, _ = tf.apply(t, cmdAt(10*ns, &raftpb.Redrive{Topic: "orders", Group: "g", All: true}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrInvalid, "all without a limit")
	r, evs = one[GroupResult](t, tf, cmdAt(11*ns, &raftpb.Ack{Topic: "orders", Group: "g", Sequences: []uint64{2}, Redriven: []uint64{3}}))
	require.Empty(t, evs)
	require.Equal(t, uint64(0), r.Group.Redriven)
	require.Equal(t, uint64(0), r.Group.Retrying, "the ack ended 2's retry state")
	require.Equal(t, uint64(3), r.Group.AckedThrough)

	// Purge.
	one[GroupResult](t, tf, cmdAt(12*ns, &raftpb.RecordFailures{Topic: "orders", Group: "g", Failures: []*raftpb.Failure{{Sequence: 4, Attempts: 3, Dead: true}}}))
	rs, evs = tf.apply(t, cmdAt(13*ns, &raftpb.PurgeDeadLetters{Topic: "orders", Group: "g", Sequences: []uint64{1}}))
	require.Equal(t, 0, rs[0].result.(DeadLettersResult).Purged)
	require.Empty(t, evs)
	dr, evs = one[DeadLettersResult](t, tf, cmdAt(13*ns, &raftpb.PurgeDeadLetters{Topic: "orders", Group: "g", Sequences: []uint64{4}}))
	require.Equal(t, 1, dr.Purged)
	require.Equal(t, []Event{{Kind: EventPurged, Topic: "orders", Group: "g"}}, evs)

	// Reset.
	r, evs = one[GroupResult](t, tf, cmdAt(14*ns, &raftpb.ResetGroup{Topic: "orders", Group: "g", To: raftpb.StartPosition_START_POSITION_TIMESTAMP, Time: 3 * ns}))
	require.Equal(t, uint64(2), r.Group.AckedThrough)
	require.Equal(t, []Event{{Kind: EventGroupReset, Topic: "orders", Group: "g"}}, evs)
	r, _ = one[GroupResult](t, tf, cmdAt(14*ns, &raftpb.ResetGroup{Topic: "orders", Group: "g", To: raftpb.StartPosition_START_POSITION_LATEST}))
	require.Equal(t, uint64(5), r.Group.AckedThrough)
	r, _ = one[GroupResult](t, tf, cmdAt(14*ns, &raftpb.ResetGroup{Topic: "orders", Group: "g", To: raftpb.StartPosition_START_POSITION_EARLIEST}))
	require.Equal(t, uint64(0), r.Group.AckedThrough)
	rs, evs = tf.apply(t, cmdAt(14*ns, &raftpb.ResetGroup{Topic: "orders", Group: "nobody"}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrNotFound)
	require.Empty(t, evs)

	// Trim.
	cl, evs := one[CleanupResult](t, tf, cmdAt(15*ns, &raftpb.Trim{Topic: "orders", Through: 2, Limit: 100}))
	require.Equal(t, 2, cl.Messages)
	require.Equal(t, []Event{{Kind: EventTrimmed, Topic: "orders"}}, evs)
	rs, evs = tf.apply(t, cmdAt(15*ns, &raftpb.Trim{Topic: "orders", Through: 2, Limit: 100}))
	require.Equal(t, 0, rs[0].result.(CleanupResult).Messages)
	require.Empty(t, evs, "nothing trimmed, no event")
	rs, _ = tf.apply(t, cmdAt(15*ns, &raftpb.Trim{Topic: "orders", Through: 2}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrInvalid, "no limit")
	require.NoError(t, tf.store.View(func(tx *halfstore.Tx) error {
		g, err := tx.Group("orders", "early")
		require.NoError(t, err)
		require.Equal(t, uint64(2), g.Dropped)
		require.Equal(t, uint64(2), g.AckedThrough)
		return nil
	}))

	// Prune: the committed half message and the dedup keys of m1..m4.
	cl, evs = one[CleanupResult](t, tf, cmdAt(100*ns, &raftpb.Prune{ResolvedBefore: 100 * ns, DedupBefore: 100 * ns, Limit: 100}))
	require.Equal(t, 5, cl.HalfMessages+cl.DedupKeys)
	require.Empty(t, evs)
	rs, _ = tf.apply(t, cmdAt(100*ns, &raftpb.Prune{ResolvedBefore: 100 * ns}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrInvalid)
	require.NoError(t, tf.store.View(func(tx *halfstore.Tx) error {
		_, err := tx.Half("h1")
		require.ErrorIs(t, err, halfstore.ErrNotFound)
		return nil
	}))
}

// eventsWorkload exercises every new command; replayed, it must give the
// same store whatever the batching.
func eventsWorkload() []*raftpb.Command {
	var cmds []*raftpb.Command
	for i := 1; i <= 12; i++ {
		cmds = append(cmds, sendCmd(int64(i)*ns, "m"+string(rune('a'+i)), []string{"x", "y", ""}[i%3]))
	}
	g := func(now int64, op any) { cmds = append(cmds, cmdAt(now, op)) }
	g(20*ns, &raftpb.CreateGroup{Topic: "orders", Group: "g"})
	g(20*ns, &raftpb.CreateGroup{Topic: "orders", Group: "h", Start: raftpb.StartPosition_START_POSITION_TIMESTAMP, StartTime: 6 * ns})
	g(21*ns, &raftpb.RecordFailures{Topic: "orders", Group: "g", Failures: []*raftpb.Failure{
		{Sequence: 1, Attempts: 1, RetryAt: 22 * ns}, {Sequence: 2, Attempts: 16, Dead: true}, {Sequence: 3, Attempts: 16, Dead: true},
	}})
	g(22*ns, &raftpb.Ack{Topic: "orders", Group: "g", Sequences: []uint64{1, 5, 6}})
	g(23*ns, &raftpb.Redrive{Topic: "orders", Group: "g", Sequences: []uint64{2}})
	g(24*ns, &raftpb.RecordFailures{Topic: "orders", Group: "g", Failures: []*raftpb.Failure{{Sequence: 2, Redriven: true, Attempts: 1, RetryAt: 25 * ns}}})
	g(25*ns, &raftpb.SetConsumerGroup{Name: "g", MaxDeliveries: 4})
	g(26*ns, &raftpb.PurgeDeadLetters{Topic: "orders", Group: "g", All: true, Limit: 1})
	g(27*ns, &raftpb.ResetGroup{Topic: "orders", Group: "h", To: raftpb.StartPosition_START_POSITION_EARLIEST})
	g(28*ns, &raftpb.Trim{Topic: "orders", Through: 4, Limit: 3})
	g(29*ns, &raftpb.Ack{Topic: "orders", Group: "g", Redriven: []uint64{2}})
	g(30*ns, &raftpb.Prune{DedupBefore: 5 * ns, Limit: 2})
	g(31*ns, &raftpb.Redrive{Topic: "orders", Group: "nobody", All: true, Limit: 1}) // refused
	return cmds
}

// state reads everything the workload touches, through the store's API.
func state(t *testing.T, s *halfstore.Store) []proto.Message {
	t.Helper()
	var out []proto.Message
	require.NoError(t, s.View(func(tx *halfstore.Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		out = append(out, tp)
		ms, err := tx.ReadTopic("orders", 0, 100)
		require.NoError(t, err)
		for _, m := range ms {
			out = append(out, m)
		}
		for _, name := range []string{"g", "h"} {
			g, err := tx.Group("orders", name)
			require.NoError(t, err)
			out = append(out, g)
			for seq := uint64(1); seq <= tp.LastSequence; seq++ {
				if r, err := tx.Retry("orders", name, seq); err == nil && r != nil {
					out = append(out, r)
				}
			}
			dls, err := tx.DeadLetters("orders", name, 0, 100)
			require.NoError(t, err)
			rds, err := tx.ReadRedriven("orders", name, 0, 100)
			require.NoError(t, err)
			for _, dl := range append(dls, rds...) {
				out = append(out, dl)
			}
			cg, err := tx.ConsumerGroup(name)
			require.NoError(t, err)
			out = append(out, cg)
		}
		return nil
	}))
	return out
}

func TestApplyDeterministicAndReplayed(t *testing.T) {
	cmds := eventsWorkload()
	one, batched := newTestFSM(t), newTestFSM(t)
	var oneEvents []Event
	for _, c := range cmds {
		_, evs := one.apply(t, c)
		oneEvents = append(oneEvents, evs...)
	}
	rs, batchEvents := batched.apply(t, cmds...)
	require.ErrorIs(t, rs[len(rs)-1].err, halfstore.ErrNotFound)
	a, b := state(t, one.store), state(t, batched.store)
	require.Equal(t, len(a), len(b))
	for i := range a {
		require.True(t, proto.Equal(a[i], b[i]), "record %d: %v vs %v", i, a[i], b[i])
	}
	// The batch reports each event once; one entry per batch reports them
	// as they come.
	require.Equal(t, []Event{
		{Kind: EventAppended, Topic: "orders"},
		{Kind: EventRedriven, Topic: "orders", Group: "g"},
		{Kind: EventGroupConfig, Group: "g"},
		{Kind: EventPurged, Topic: "orders", Group: "g"},
		{Kind: EventGroupReset, Topic: "orders", Group: "h"},
		{Kind: EventTrimmed, Topic: "orders"},
	}, batchEvents)
	require.Len(t, oneEvents, 12+5)

	// Replaying entries the store has applies nothing and reports nothing.
	before := state(t, batched.store)
	batched.events = nil
	res := batched.f.ApplyBatch(logsOf(t, 1, cmds))
	for i, r := range res {
		require.Nil(t, r, "entry %d applied twice", i+1)
	}
	require.Empty(t, batched.events)
	after := state(t, batched.store)
	for i := range before {
		require.True(t, proto.Equal(before[i], after[i]), "record %d changed on replay", i)
	}
}

// Every way out of PENDING reports one EventResolved with the message as
// it was left; resolutions that change nothing report none.
func TestResolvedEvents(t *testing.T) {
	tf := newTestFSM(t)
	half := func(now int64, id string) *raftpb.Command {
		return cmdAt(now, &raftpb.SendHalf{Topic: "orders", MessageId: id, ProducerGroup: "pg", TransactionId: "tx-" + id, CreateTopic: true, CheckAfter: ns})
	}
	res := func(now int64, id string, r raftpb.Resolution, src storepb.Source) *raftpb.Command {
		return cmdAt(now, &raftpb.Resolve{MessageId: id, Resolution: r, Source: src})
	}
	commit, rollback := raftpb.Resolution_RESOLUTION_COMMIT, raftpb.Resolution_RESOLUTION_ROLLBACK
	rs, _ := tf.apply(t, half(1*ns, "a"), half(1*ns, "b"), half(1*ns, "c"), half(1*ns, "d"), half(1*ns, "e"))
	for _, r := range rs {
		require.NoError(t, r.err)
	}
	require.Empty(t, tf.resolved, "storing a half message resolves nothing")

	rs, _ = tf.apply(t,
		cmdAt(2*ns, &raftpb.RecordCheck{MessageId: "b", Reached: true, Error: "answered UNKNOWN", NextCheckAt: 3 * ns}),
		res(3*ns, "a", commit, storepb.Source_SOURCE_PRODUCER),
		res(4*ns, "a", commit, storepb.Source_SOURCE_PRODUCER),
		res(5*ns, "b", rollback, storepb.Source_SOURCE_CHECKBACK),
		cmdAt(6*ns, &raftpb.Expire{MessageId: "c"}),
		cmdAt(7*ns, &raftpb.Expire{MessageId: "c"}),
		res(8*ns, "c", commit, storepb.Source_SOURCE_OPERATOR),
		cmdAt(9*ns, &raftpb.Expire{MessageId: "d", Rollback: true}),
		res(10*ns, "e", rollback, storepb.Source_SOURCE_PRODUCER),
		res(11*ns, "e", commit, storepb.Source_SOURCE_PRODUCER),
	)
	require.False(t, rs[2].result.(HalfResult).Changed, "a repeated commit changes nothing")
	require.False(t, rs[5].result.(HalfResult).Changed, "expiring an expired message changes nothing")
	require.ErrorIs(t, rs[9].err, halfstore.ErrConflict)
	type seen struct {
		id       string
		state    storepb.HalfState
		source   storepb.Source
		resolved int64
		attempts uint32
	}
	var got []seen
	for _, ev := range tf.resolved {
		require.Equal(t, "orders", ev.Topic)
		require.Equal(t, "pg", ev.Group)
		require.Equal(t, 1*ns, ev.Half.CreatedAt)
		got = append(got, seen{ev.Half.Id, ev.Half.State, ev.Half.ResolutionSource, ev.Half.ResolvedAt, ev.Half.CheckAttempts})
	}
	require.Equal(t, []seen{
		{"a", storepb.HalfState_HALF_STATE_COMMITTED, storepb.Source_SOURCE_PRODUCER, 3 * ns, 0},
		// b's UNKNOWN and the check-back that rolled it back.
		{"b", storepb.HalfState_HALF_STATE_ROLLED_BACK, storepb.Source_SOURCE_CHECKBACK, 5 * ns, 2},
		{"c", storepb.HalfState_HALF_STATE_EXPIRED, storepb.Source_SOURCE_EXPIRY, 6 * ns, 0},
		{"c", storepb.HalfState_HALF_STATE_COMMITTED, storepb.Source_SOURCE_OPERATOR, 8 * ns, 0},
		{"d", storepb.HalfState_HALF_STATE_ROLLED_BACK, storepb.Source_SOURCE_EXPIRY, 9 * ns, 0},
		{"e", storepb.HalfState_HALF_STATE_ROLLED_BACK, storepb.Source_SOURCE_PRODUCER, 10 * ns, 0},
	}, got)
}

// Updates carry intent: each sets only its fields, merged into what is
// stored when applied, so their order does not lose one of them. The
// whole-record commands of earlier versions still apply as written.
func TestApplyPolicyUpdatesMerge(t *testing.T) {
	tf := newTestFSM(t)
	pu := func(now int64, op *raftpb.UpdateProducerGroup) *raftpb.Command {
		return &raftpb.Command{Now: now, Op: &raftpb.Command_UpdateProducerGroup{UpdateProducerGroup: op}}
	}
	cu := func(now int64, op *raftpb.UpdateConsumerGroup) *raftpb.Command {
		return &raftpb.Command{Now: now, Op: &raftpb.Command_UpdateConsumerGroup{UpdateConsumerGroup: op}}
	}
	rs, evs := tf.apply(t,
		pu(1, &raftpb.UpdateProducerGroup{Name: "shop", MaxChecks: proto.Uint32(7)}),
		pu(2, &raftpb.UpdateProducerGroup{Name: "shop", CallbackUrl: proto.String("http://127.0.0.1:9/check")}),
		pu(3, &raftpb.UpdateProducerGroup{Name: "shop", ExpiryAction: storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK.Enum()}),
		cu(4, &raftpb.UpdateConsumerGroup{Name: "points", MaxDeliveries: proto.Uint32(3)}),
		cu(5, &raftpb.UpdateConsumerGroup{Name: "points", RedeliveryBackoff: &raftpb.Backoff{Steps: []int64{ns}}}),
		cu(6, &raftpb.UpdateConsumerGroup{Name: "points", OrderedPoison: storepb.OrderedPoison_ORDERED_POISON_HOLD.Enum()}),
		// Clearing a field is a change too: an empty callback that is set.
		pu(7, &raftpb.UpdateProducerGroup{Name: "shop", CallbackUrl: proto.String("")}),
		// A refusal changes nothing: a cap of the backoff below the backoff.
		pu(8, &raftpb.UpdateProducerGroup{Name: "shop", CheckBackoff: proto.Int64(10 * ns), MaxCheckBackoff: proto.Int64(ns)}),
	)
	for _, r := range rs[:7] {
		require.NoError(t, r.err)
	}
	require.ErrorIs(t, rs[7].err, halfstore.ErrInvalid)
	require.Equal(t, []Event{{Kind: EventGroupConfig, Group: "points"}}, evs)
	wantPG := &storepb.ProducerGroup{Name: "shop", MaxChecks: 7, ExpiryAction: storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK}
	wantCG := &storepb.ConsumerGroup{Name: "points", MaxDeliveries: 3, RedeliveryBackoff: []int64{ns}, OrderedPoison: storepb.OrderedPoison_ORDERED_POISON_HOLD}
	requirePolicies(t, tf.store, wantPG, wantCG)

	// A whole record of an earlier version replaces what is stored.
	_, _ = one[ProducerGroupResult](t, tf, cmdAt(9, &raftpb.SetProducerGroup{Name: "shop", MaxChecks: 2}))
	_, _ = one[ConsumerGroupResult](t, tf, cmdAt(10, &raftpb.SetConsumerGroup{Name: "points", AckDeadline: 5 * ns}))
	requirePolicies(t, tf.store, &storepb.ProducerGroup{Name: "shop", MaxChecks: 2}, &storepb.ConsumerGroup{Name: "points", AckDeadline: 5 * ns})
}

func requirePolicies(t *testing.T, s *halfstore.Store, pg *storepb.ProducerGroup, cg *storepb.ConsumerGroup) {
	t.Helper()
	require.NoError(t, s.View(func(tx *halfstore.Tx) error {
		got, err := tx.ProducerGroup(pg.Name)
		require.NoError(t, err)
		require.True(t, proto.Equal(pg, got), "%v", got)
		gotCG, err := tx.ConsumerGroup(cg.Name)
		require.NoError(t, err)
		require.True(t, proto.Equal(cg, gotCG), "%v", gotCG)
		return nil
	}))
}

// The store behind a crash (the file as a kill -9 leaves it, without the
// open transaction) plus a replay of the log equals a store built from the
// log alone, wherever the crash fell.
func TestWriteBehindCrashThenReplayEqualsTheLog(t *testing.T) {
	cmds := eventsWorkload()
	logs := logsOf(t, 1, cmds)
	ref := newTestFSM(t)
	ref.f.ApplyBatch(logs)
	want := state(t, ref.store)
	for _, cut := range []int{0, 3, len(logs) / 2, len(logs) - 1, len(logs)} {
		tf := newTestFSM(t)
		// The batches up to the cut committed, the rest applied and
		// answered only.
		for i := 0; i < len(logs); i += 4 {
			tf.f.ApplyBatch(logs[i:min(i+4, len(logs))])
			if i+4 <= cut {
				tf.f.commit()
			}
		}
		raw, err := os.ReadFile(tf.store.Path())
		require.NoError(t, err)
		idx := appliedIndexOf(t, raw)
		require.Equal(t, uint64(cut-cut%4), idx, "cut at %d: the file holds what was committed only", cut)
		crashed := filepath.Join(t.TempDir(), "fsm.db")
		require.NoError(t, os.WriteFile(crashed, raw, 0o600))
		s, err := halfstore.Open(crashed)
		require.NoError(t, err)
		re := newFSM(s, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, Hooks{}, nil, nil)
		re.ApplyBatch(logs)
		got := state(t, s)
		require.Equal(t, len(want), len(got), "cut at %d", cut)
		for i := range want {
			require.True(t, proto.Equal(want[i], got[i]), "cut at %d, record %d: %v vs %v", cut, i, want[i], got[i])
		}
		require.NoError(t, s.Close())
	}
}

// appliedIndexOf opens a copy of a store file and reads its applied index.
func appliedIndexOf(t *testing.T, raw []byte) uint64 {
	t.Helper()
	p := filepath.Join(t.TempDir(), "copy.db")
	require.NoError(t, os.WriteFile(p, raw, 0o600))
	s, err := halfstore.Open(p)
	require.NoError(t, err)
	defer s.Close()
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	return idx
}

// TestFSMLatestStamp: the store keeps the latest time stamped into an
// applied command, batches and merged proposals included; an older stamp
// (a leader whose clock is behind) never lowers it; it survives a reopen.
func TestFSMLatestStamp(t *testing.T) {
	tf := newTestFSM(t)
	stamp := func() int64 {
		var got int64
		require.NoError(t, tf.store.View(func(tx *halfstore.Tx) error {
			got = tx.Stamp()
			return nil
		}))
		require.Equal(t, got, tf.f.stamp.Load(), "memory and store agree")
		return got
	}
	require.Zero(t, stamp())
	tf.apply(t, sendHalf("t", "m1", "g", "tx1", 10*ns), sendHalf("t", "m2", "g", "tx2", 30*ns), sendHalf("t", "m3", "g", "tx3", 20*ns))
	require.Equal(t, 30*ns, stamp())
	merged := &raftpb.Batch{Commands: []*raftpb.Command{sendHalf("t", "m4", "g", "tx4", 40*ns), sendHalf("t", "m5", "g", "tx5", 35*ns)}}
	tf.f.ApplyBatch(logsOf(t, tf.next, []*raftpb.Command{{Op: &raftpb.Command_Batch{Batch: merged}}}))
	tf.next++
	require.Equal(t, 40*ns, stamp())
	tf.apply(t, sendHalf("t", "m6", "g", "tx6", 5*ns))
	require.Equal(t, 40*ns, stamp(), "an older stamp does not lower it")

	re := newFSM(tf.store, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, Hooks{}, nil, nil)
	require.NoError(t, re.loadStamp())
	require.Equal(t, 40*ns, re.stamp.Load())
}
