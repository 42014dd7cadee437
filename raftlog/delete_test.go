package raftlog

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// A deletion applies to the topic as it is at its place in the log: a
// commit ordered before it goes with the topic, a write ordered after it
// finds no topic (or, with create_topic, a new one), the same on every
// node.
func TestApplyDeleteTopicAtItsPlaceInTheLog(t *testing.T) {
	tf := newTestFSM(t)
	one[SendResult](t, tf, sendCmd(1*ns, "m1", ""))
	one[GroupResult](t, tf, cmdAt(1*ns, &raftpb.CreateGroup{Topic: "orders", Group: "g", AutoCreated: true}))
	one[HalfResult](t, tf, sendHalf("orders", "h1", "shop", "tx-1", 2*ns))

	rs, evs := tf.apply(t, cmdAt(3*ns, &raftpb.DeleteTopic{Name: "orders"}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrConflict, "a pending half message would commit into the topic")
	require.Empty(t, evs, "no event for a refusal")

	// One batch: the commit of h1, the deletion, then a send that does not
	// create topics and one that does.
	rs, evs = tf.apply(t,
		resolveCmd("h1", raftpb.Resolution_RESOLUTION_COMMIT, 4*ns),
		cmdAt(4*ns, &raftpb.DeleteTopic{Name: "orders"}),
		cmdAt(4*ns, &raftpb.Send{Topic: "orders", MessageId: "m2"}),
		sendCmd(5*ns, "m3", ""),
	)
	require.NoError(t, rs[0].err)
	require.NoError(t, rs[1].err)
	del := rs[1].result.(DeleteResult)
	require.Equal(t, uint64(2), del.Topic.LastSequence, "h1, committed before the deletion, went with the topic")
	require.Len(t, del.Groups, 1)
	require.Equal(t, "g", del.Groups[0].Group.Name)
	require.True(t, del.Groups[0].Group.AutoCreated)
	require.Equal(t, uint64(2), del.Groups[0].Lag.Lag)
	require.ErrorIs(t, rs[2].err, halfstore.ErrNotFound, "a send after the deletion finds no topic")
	require.NoError(t, rs[3].err)
	require.Equal(t, uint64(1), rs[3].result.(SendResult).Sequence, "with create_topic it starts a new topic")
	require.False(t, rs[3].result.(SendResult).Duplicate)
	require.Equal(t, []Event{
		{Kind: EventAppended, Topic: "orders"},
		{Kind: EventDeleted, Topic: "orders"},
	}, evs)

	rs, evs = tf.apply(t, cmdAt(6*ns, &raftpb.DeleteTopic{Name: "missing"}), cmdAt(6*ns, &raftpb.DeleteTopic{}))
	require.ErrorIs(t, rs[0].err, halfstore.ErrNotFound)
	require.ErrorIs(t, rs[1].err, halfstore.ErrInvalid)
	require.Empty(t, evs)
}

func TestApplyDeleteGroup(t *testing.T) {
	tf := newTestFSM(t)
	one[SendResult](t, tf, sendCmd(1*ns, "m1", ""))
	one[GroupResult](t, tf, cmdAt(1*ns, &raftpb.CreateGroup{Topic: "orders", Group: "g"}))
	one[GroupResult](t, tf, cmdAt(1*ns, &raftpb.CreateGroup{Topic: "orders", Group: "h"}))
	one[ConsumerGroupResult](t, tf, cmdAt(1*ns, &raftpb.SetConsumerGroup{Name: "g", MaxDeliveries: 3}))

	r, evs := one[DeleteResult](t, tf, cmdAt(2*ns, &raftpb.DeleteGroup{Group: "g"}))
	require.True(t, r.Policy)
	require.Len(t, r.Groups, 1)
	require.Equal(t, uint64(1), r.Groups[0].Lag.Lag)
	require.Equal(t, []Event{{Kind: EventDeleted, Topic: "orders", Group: "g"}}, evs)

	// A late ack of the deleted group (a dispatcher that had not stopped
	// yet) is refused and re-creates nothing.
	rs, evs := tf.apply(t,
		cmdAt(3*ns, &raftpb.Ack{Topic: "orders", Group: "g", Sequences: []uint64{1}}),
		cmdAt(3*ns, &raftpb.DeleteGroup{Group: "g"}),
		cmdAt(3*ns, &raftpb.DeleteGroup{Group: "h", Topic: "payments"}),
		cmdAt(3*ns, &raftpb.DeleteGroup{Topic: "orders"}),
	)
	require.ErrorIs(t, rs[0].err, halfstore.ErrNotFound)
	require.ErrorIs(t, rs[1].err, halfstore.ErrNotFound, "deleted already")
	require.ErrorIs(t, rs[2].err, halfstore.ErrNotFound, "no such topic")
	require.ErrorIs(t, rs[3].err, halfstore.ErrInvalid, "no group named")
	require.Empty(t, evs)

	r, evs = one[DeleteResult](t, tf, cmdAt(4*ns, &raftpb.DeleteGroup{Group: "h", Topic: "orders"}))
	require.False(t, r.Policy)
	require.Equal(t, []Event{{Kind: EventDeleted, Topic: "orders", Group: "h"}}, evs)
}
