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
// must refuse what it cannot decode or apply with a Result error, never
// panic, and still advance its applied index.
func FuzzApplyBatch(f *testing.F) {
	for _, cmd := range []*raftpb.Command{
		sendHalf("t", "m1", "g", "tx", 1),
		resolveCmd("m1", raftpb.Resolution_RESOLUTION_COMMIT, 2),
		{Now: 3, Op: &raftpb.Command_Ack{Ack: &raftpb.Ack{Topic: "t", Group: "g", Sequences: []uint64{1, 2}}}},
		{Now: 4, Op: &raftpb.Command_CreateGroup{CreateGroup: &raftpb.CreateGroup{Topic: "t", Group: "g"}}},
		{Now: 5, Op: &raftpb.Command_Send{Send: &raftpb.Send{Topic: "t", MessageId: "m2", Key: "k", Body: []byte("x")}}},
		{Now: 6},
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
		m := &fsm{store: store, logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
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
