package raftlog

import (
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// FuzzApplyBatch feeds arbitrary bytes as committed log entries: the FSM
// must refuse what it cannot decode or apply (a refusal in the entry's result), never
// panic, and still advance its applied index.
func FuzzApplyBatch(f *testing.F) {
	for _, cmd := range []*raftpb.Command{
		sendHalf("t", "m1", "g", "tx", 1),
		resolveCmd("m1", raftpb.Resolution_RESOLUTION_COMMIT, 2),
		{Now: 3, Op: &raftpb.Command_Ack{Ack: &raftpb.Ack{Topic: "t", Group: "g", Sequences: []uint64{1, 2}}}},
		{Now: 4, Op: &raftpb.Command_CreateGroup{CreateGroup: &raftpb.CreateGroup{Topic: "t", Group: "g"}}},
		{Now: 5, Op: &raftpb.Command_Send{Send: &raftpb.Send{Topic: "t", MessageId: "m2", Key: "k", Body: []byte("x")}}},
		{Now: 6},
		cmdAt(7, &raftpb.RecordFailures{Topic: "t", Group: "g", Failures: []*raftpb.Failure{{Sequence: 1, Attempts: 2, Dead: true}}}),
		cmdAt(8, &raftpb.Redrive{Topic: "t", Group: "g", All: true, Limit: 5}),
		cmdAt(9, &raftpb.PurgeDeadLetters{Topic: "t", Group: "g", Sequences: []uint64{1}}),
		cmdAt(10, &raftpb.ResetGroup{Topic: "t", Group: "g", To: raftpb.StartPosition_START_POSITION_TIMESTAMP, Time: 5}),
		cmdAt(11, &raftpb.SetConsumerGroup{Name: "g", MaxDeliveries: 2}),
		cmdAt(12, &raftpb.Trim{Topic: "t", Through: 1, Limit: 1}),
		cmdAt(13, &raftpb.Prune{ResolvedBefore: 13, DedupBefore: 13, Limit: 10}),
		cmdAt(14, &raftpb.DeleteGroup{Group: "g", Topic: "t"}),
		cmdAt(15, &raftpb.DeleteTopic{Name: "t"}),
	} {
		b, err := proto.Marshal(cmd)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0xff, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		store, err := halfstore.Open(filepath.Join(t.TempDir(), "fsm.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		m := newFSM(store, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, Hooks{}, nil, nil)
		seed, _ := proto.Marshal(sendHalf("t", "m1", "g", "tx", 1))
		logs := []*raft.Log{
			{Index: 1, Type: raft.LogCommand, Data: seed},
			{Index: 2, Type: raft.LogCommand, Data: data},
			{Index: 3, Type: raft.LogCommand, Data: data},
		}
		res := m.ApplyBatch(logs)
		if len(res) != len(logs) {
			t.Fatalf("got %d results for %d entries", len(res), len(logs))
		}
		idx, err := store.AppliedIndex()
		if err != nil || idx != 3 {
			t.Fatalf("applied index %d, %v", idx, err)
		}
	})
}
