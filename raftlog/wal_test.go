package raftlog_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog"
)

// TestMigrateBoltToWAL: a node whose log is in raft.db, restarted with the
// wal store, copies its log, term and vote into the wal, keeps raft.db as
// raft.db.migrated, re-applies nothing and goes on; the bolt store then
// refuses the directory with a message that says why.
func TestMigrateBoltToWAL(t *testing.T) {
	store := raftlog.LogStoreBolt
	c := single(t, func(cfg *raftlog.Config) { cfg.LogStore = store })
	n := c.Leader().Node()
	for i := range 50 {
		id := fmt.Sprintf("m%02d", i)
		mustSendHalf(t, n, "orders", id, "shop", "tx"+id, int64(i))
		mustCommit(t, n, id, int64(i))
	}
	dir := c.Dir("n1")
	require.FileExists(t, filepath.Join(dir, "raft.db"))
	require.NoDirExists(t, filepath.Join(dir, "raft-wal"))
	lastBefore := lastLogIndex(t, n)

	store = raftlog.LogStoreWAL
	c.Restart("n1")
	n = c.Leader().Node()
	require.FileExists(t, filepath.Join(dir, "raft.db.migrated"))
	require.NoFileExists(t, filepath.Join(dir, "raft.db"))
	require.DirExists(t, filepath.Join(dir, "raft-wal"))
	require.GreaterOrEqual(t, lastLogIndex(t, n), lastBefore, "the log came along")
	require.Zero(t, n.AppliedByFSM(), "no entry may be applied twice")
	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(50), tp.LastSequence)
		return nil
	}))
	mustSendHalf(t, n, "orders", "new", "shop", "txnew", 1000)
	mustCommit(t, n, "new", 1001)

	// Restarted again on the wal: no second migration, the new entries
	// are there.
	c.Restart("n1")
	require.Zero(t, c.Leader().Node().AppliedByFSM())

	c.Stop("n1")
	_, err := raftlog.Open(raftlog.Config{NodeID: "n1", Dir: dir, RaftAddr: "127.0.0.1:0", LogStore: raftlog.LogStoreBolt})
	require.ErrorContains(t, err, "cannot read it")
	_, err = raftlog.Open(raftlog.Config{NodeID: "n1", Dir: dir, RaftAddr: "127.0.0.1:0", LogStore: "rocksdb"})
	require.ErrorContains(t, err, `unknown log store "rocksdb"`)
}

// TestWALCorruptionStopsTheNode: damage in a sealed part of the log is
// not a torn write; the node refuses to start and names the file.
func TestWALCorruptionStopsTheNode(t *testing.T) {
	c := single(t, nil)
	n := c.Leader().Node()
	mustSendHalf(t, n, "orders", "m1", "shop", "tx1", 1)
	dir := c.Dir("n1")
	c.Stop("n1")
	segs, err := filepath.Glob(filepath.Join(dir, "raft-wal", "*.wal"))
	require.NoError(t, err)
	require.Len(t, segs, 1)
	// The segment header is not a write in progress.
	f, err := os.OpenFile(segs[0], os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("XX"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	_, err = raftlog.Open(raftlog.Config{NodeID: "n1", Dir: dir, RaftAddr: "127.0.0.1:0"})
	require.ErrorContains(t, err, "corrupt")
	require.ErrorContains(t, err, segs[0])
}

func lastLogIndex(t *testing.T, n *raftlog.Node) uint64 {
	t.Helper()
	st, err := n.Status()
	require.NoError(t, err)
	return st.LastLogIndex
}
