package raftlog_test

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/internal/diskio"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// diskFull makes n's store commits fail as on a full disk until the
// returned function is called.
func diskFull(n *raftlog.Node) (free func()) {
	var full atomic.Bool
	full.Store(true)
	n.Store().Writer().InjectFault(func() error {
		if full.Load() {
			return &os.PathError{Op: "write", Path: n.Store().Path(), Err: syscall.ENOSPC}
		}
		return nil
	})
	return func() { full.Store(false) }
}

// A store that cannot commit (disk full) stalls the node instead of
// crashing it: proposals are refused with an error that says so, reads
// fail rather than read behind what was answered, and once the disk has
// room again the node applies again what the failed commit lost and goes
// on, without a restart. Nothing acknowledged is lost.
func TestDiskFullStallsAndRecovers(t *testing.T) {
	n := single(t, nil).Leader().Node()
	mustSendHalf(t, n, "orders", "m1", "shop", "tx1", 1)
	require.NoError(t, n.Store().View(func(*halfstore.Tx) error { return nil }), "committed before the disk fills")
	free := diskFull(n)
	// Acknowledged before its commit (write-behind), which fails; or
	// answered with the stall when that came first (a retry is safe).
	_, err := proposeResolve(ctxT(t), n, "m1", raftpb.Resolution_RESOLUTION_COMMIT, 2)
	acked := err == nil
	if !acked {
		require.ErrorIs(t, err, diskio.ErrWrite)
	}
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := proposeHalf(ctxT(t), n, "orders", "m2", "shop", "tx2", 3)
		if err == nil {
			return errors.New("a proposal was accepted on a full disk")
		}
		if !errors.Is(err, diskio.ErrWrite) || !errors.Is(err, syscall.ENOSPC) {
			return fmt.Errorf("refused with %v, not the full disk", err)
		}
		require.ErrorContains(t, err, "node n1")
		return nil
	})
	require.ErrorIs(t, n.Store().View(func(*halfstore.Tx) error { return nil }), diskio.ErrWrite)

	free()
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := proposeHalf(ctxT(t), n, "orders", "m2", "shop", "tx2", 3)
		return err
	})
	if !acked {
		mustCommit(t, n, "m1", 2)
	}
	mustCommit(t, n, "m2", 4)
	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		msgs, err := tx.ReadTopic("orders", 1, 10)
		require.NoError(t, err)
		require.Len(t, msgs, 2, "the commit acknowledged on the full disk is there")
		require.Equal(t, []byte("body-tx1"), msgs[0].Body)
		return nil
	}))
}

// A leader whose disk is full hands leadership to another node, which
// serves writes; once the disk has room it catches up, with every entry.
func TestDiskFullLeaderHandsOver(t *testing.T) {
	c := txmqtest.NewCluster(t, 3, txmqtest.OpenRaft(nil), txmqtest.Static())
	old := c.Leader().Node()
	free := diskFull(old)
	for i := range 20 {
		id := fmt.Sprintf("m%02d", i)
		txmqtest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
			n := c.Leader().Node()
			if _, err := proposeHalf(ctxT(t), n, "orders", id, "shop", "tx"+id, int64(i)); err != nil {
				return err
			}
			_, err := proposeResolve(ctxT(t), n, id, raftpb.Resolution_RESOLUTION_COMMIT, int64(i))
			return err
		})
	}
	// The writes may all be answered before the old leader's first paced
	// commit finds the disk full: they are in the log of a majority. The
	// hand-over follows that commit.
	txmqtest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		l, ok := c.CurrentLeader()
		switch {
		case !ok:
			return fmt.Errorf("no leader")
		case l.Node().ID() == old.ID():
			return fmt.Errorf("%s still leads on its full disk", old.ID())
		}
		return nil
	})
	require.ErrorIs(t, old.Store().View(func(*halfstore.Tx) error { return nil }), diskio.ErrWrite, "the stalled node serves no reads")
	free()
	want, err := c.Leader().Node().Store().AppliedIndex()
	require.NoError(t, err)
	txmqtest.CheckFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		got, err := old.Store().AppliedIndex()
		if err != nil {
			return err
		}
		if got < want {
			return fmt.Errorf("%s applied through %d, the leader %d", old.ID(), got, want)
		}
		return nil
	})
	c.VerifyStores()
}
