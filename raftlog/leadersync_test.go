package raftlog_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
)

// The leader syncs its appends behind them, while they replicate. Until its
// own fsync is done no proposer is answered and no node applies the entry,
// although both followers hold it: the entry is durable on two nodes, the
// leader and a follower, before anyone relies on it. Then it goes on.
func TestLeaderSyncsBehindItsAppends(t *testing.T) {
	c := txmqtest.NewCluster(t, 3, txmqtest.OpenRaft(nil), txmqtest.Static())
	leader := c.Leader().Node()
	mustSendHalf(t, leader, "orders", "m0", "shop", "tx0", 1)

	release := make(chan struct{})
	var held atomic.Int32
	leader.HoldLogSyncs(func() {
		held.Add(1)
		<-release
	})
	defer leader.HoldLogSyncs(nil)
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	answered := make(chan error, 1)
	go func() {
		_, err := proposeHalf(ctxT(t), leader, "orders", "m1", "shop", "tx1", 2)
		answered <- err
	}()
	var target uint64
	txmqtest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		if held.Load() == 0 {
			return fmt.Errorf("the leader has not synced behind an append yet")
		}
		target = lastLogIndex(t, leader)
		for _, n := range c.Nodes() {
			if got := lastLogIndex(t, n.Node()); got < target {
				return fmt.Errorf("%s holds up to %d, the leader %d", n.Node().ID(), got, target)
			}
		}
		return nil
	})
	select {
	case err := <-answered:
		t.Fatalf("answered (%v) before the leader's own log held the entry durably", err)
	case <-time.After(300 * time.Millisecond):
	}
	for _, n := range c.Nodes() {
		st, err := n.Node().Status()
		require.NoError(t, err)
		require.Less(t, st.StoreAppliedIndex, target, "%s applied entry %d before the leader's fsync of it", st.NodeID, target)
		if n.Node() != leader {
			require.Less(t, st.CommitIndex, target, "%s heard entry %d was committed before the leader's fsync of it", st.NodeID, target)
		}
	}

	close(release)
	require.NoError(t, <-answered)
	txmqtest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, n := range c.Nodes() {
			st, err := n.Node().Status()
			if err != nil {
				return err
			}
			if st.StoreAppliedIndex < target {
				return fmt.Errorf("%s applied up to %d, not %d", st.NodeID, st.StoreAppliedIndex, target)
			}
		}
		return nil
	})
	c.VerifyStores()
}

// With SyncLeaderAppend the leader fsyncs each append before Raft
// replicates it, as hashicorp/raft does: nothing is synced behind.
func TestSyncLeaderAppend(t *testing.T) {
	c := txmqtest.NewCluster(t, 3, txmqtest.OpenRaft(func(cfg *raftlog.Config) { cfg.SyncLeaderAppend = true }), txmqtest.Static())
	leader := c.Leader().Node()
	var held atomic.Int32
	leader.HoldLogSyncs(func() { held.Add(1) })
	for i := range 20 {
		id := fmt.Sprintf("m%02d", i)
		mustSendHalf(t, leader, "orders", id, "shop", "tx"+id, int64(i))
		mustCommit(t, leader, id, int64(i))
	}
	require.Zero(t, held.Load(), "a sync ran behind an append")
	c.VerifyStores()
}
