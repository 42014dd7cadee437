package raftlog

import (
	"fmt"
	"testing"

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
