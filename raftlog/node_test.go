package raftlog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// hashicorp/raft leaves these behind for a moment after Shutdown.
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"),
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*Raft).runSnapshots"),
		// Closing a NetworkTransport leaves connections accepted from
		// peers to end when the peers close them.
		goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"),
		goleak.IgnoreAnyFunction("github.com/txmq/txmq/raftlog.waitApplied"),
	)
}

func testConfig(dir string) Config {
	return Config{
		NodeID:             "n1",
		Dir:                dir,
		RaftAddr:           "127.0.0.1:0",
		Bootstrap:          true,
		HeartbeatTimeout:   50 * time.Millisecond,
		ElectionTimeout:    50 * time.Millisecond,
		LeaderLeaseTimeout: 50 * time.Millisecond,
		CommitTimeout:      5 * time.Millisecond,
		Logger:             slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func openLeader(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, n.WaitLeader(ctx))
	require.NoError(t, n.Barrier(ctx))
	return n
}

// proposeAs proposes a command through the typed path the calls of
// commands.go take and returns its result as R.
func proposeAs[R any](t *testing.T, n *Node, cmd *raftpb.Command) R {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := proposeCmd[R](ctx, n, cmd)
	require.NoError(t, err)
	return r
}

func proposeCmd[R any](ctx context.Context, n *Node, cmd *raftpb.Command) (R, error) {
	return propose[R](ctx, n, time.Unix(0, cmd.Now), cmd)
}

func sendHalf(topic, id, group, tx string, now int64) *raftpb.Command {
	return &raftpb.Command{Now: now, Op: &raftpb.Command_SendHalf{SendHalf: &raftpb.SendHalf{
		Topic: topic, MessageId: id, ProducerGroup: group, TransactionId: tx,
		Body: []byte("body-" + id), CreateTopic: true, CheckAfter: int64(6 * time.Second),
	}}}
}

func resolveCmd(id string, r raftpb.Resolution, now int64) *raftpb.Command {
	return &raftpb.Command{Now: now, Op: &raftpb.Command_Resolve{Resolve: &raftpb.Resolve{
		MessageId: id, Resolution: r, Source: storepb.Source_SOURCE_PRODUCER,
	}}}
}

func TestProposeLifecycle(t *testing.T) {
	n := openLeader(t, testConfig(t.TempDir()))
	defer n.Close()

	r := proposeAs[HalfResult](t, n, sendHalf("orders", "m1", "shop", "tx1", 100))
	require.True(t, r.Changed)
	require.Equal(t, "m1", r.Half.Id)
	require.Equal(t, storepb.HalfState_HALF_STATE_PENDING, r.Half.State)

	r = proposeAs[HalfResult](t, n, sendHalf("orders", "m2", "shop", "tx1", 101))
	require.False(t, r.Changed, "same group + tx is the same message")
	require.Equal(t, "m1", r.Half.Id)

	r = proposeAs[HalfResult](t, n, resolveCmd("m1", raftpb.Resolution_RESOLUTION_COMMIT, 200))
	require.Equal(t, uint64(1), r.Half.Sequence)

	_, err := proposeCmd[HalfResult](context.Background(), n, resolveCmd("m1", raftpb.Resolution_RESOLUTION_ROLLBACK, 300))
	require.ErrorIs(t, err, halfstore.ErrConflict)
	require.ErrorIs(t, err, ErrRefused)
	require.ErrorContains(t, err, "COMMITTED")

	_, err = proposeCmd[HalfResult](context.Background(), n, resolveCmd("nope", raftpb.Resolution_RESOLUTION_COMMIT, 300))
	require.ErrorIs(t, err, halfstore.ErrNotFound)

	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		msgs, err := tx.ReadTopic("orders", 1, 10)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, []byte("body-m1"), msgs[0].Body)
		require.Equal(t, int64(200), msgs[0].CommittedAt, "the leader's stamped time, not the clock")
		return nil
	}))
}

func TestOnApplyEvents(t *testing.T) {
	var mu sync.Mutex
	var got []string
	cfg := testConfig(t.TempDir())
	cfg.OnApply = func(evs []Event) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range evs {
			if e.Kind != EventResolved {
				got = append(got, e.Topic)
			}
		}
	}
	n := openLeader(t, cfg)
	defer n.Close()
	proposeAs[any](t, n, sendHalf("orders", "m1", "shop", "tx1", 1))
	mu.Lock()
	require.Empty(t, got, "a half message is invisible: nothing to wake for")
	mu.Unlock()
	proposeAs[any](t, n, resolveCmd("m1", raftpb.Resolution_RESOLUTION_COMMIT, 2))
	proposeAs[any](t, n, &raftpb.Command{Now: 3, Op: &raftpb.Command_Send{Send: &raftpb.Send{
		Topic: "audit", MessageId: "m2", Body: []byte("x"), CreateTopic: true,
	}}})
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"orders", "audit"}, got)
}

// The hooks hear of every proposal, log write, applied batch and snapshot.
func TestHooks(t *testing.T) {
	var mu sync.Mutex
	var stored, applied, snapshots, proposed, replicated int
	cfg := testConfig(t.TempDir())
	cfg.Hooks = Hooks{
		Proposed: func(waited []time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			proposed += len(waited)
		},
		Replicated: func(d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			replicated++
		},
		LogStored: func(entries int, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			stored += entries
		},
		Applied: func(entries int, d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			applied += entries
		},
		SnapshotPersisted: func(d time.Duration) {
			mu.Lock()
			defer mu.Unlock()
			snapshots++
		},
	}
	n := openLeader(t, cfg)
	defer n.Close()
	for i := 0; i < 5; i++ {
		proposeAs[any](t, n, sendHalf("orders", fmt.Sprint("m", i), "shop", fmt.Sprint("tx", i), int64(i)))
	}
	_, err := n.Snapshot()
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, stored, 5, "every entry reaches the log store")
	require.Equal(t, 5, applied, "entries that changed the store")
	require.Equal(t, 1, snapshots)
	require.Equal(t, 5, proposed, "each proposal was handed to raft.Apply")
	require.Equal(t, 5, replicated, "one at a time: one entry each")
}

// A restart does not apply the log again: the store's applied index
// survives, and the FSM skips every entry at or below it.
func TestRestartSkipsAppliedEntries(t *testing.T) {
	dir := t.TempDir()
	n := openLeader(t, testConfig(dir))
	for i := 0; i < 50; i++ {
		id := fmt.Sprintf("m%02d", i)
		proposeAs[any](t, n, sendHalf("orders", id, "shop", "tx"+id, int64(i)))
		proposeAs[any](t, n, resolveCmd(id, raftpb.Resolution_RESOLUTION_COMMIT, int64(i)))
	}
	before, err := n.Store().AppliedIndex()
	require.NoError(t, err)
	require.Greater(t, before, uint64(100))
	require.NoError(t, n.Close())

	n = openLeader(t, testConfig(dir))
	defer n.Close()
	after, err := n.Store().AppliedIndex()
	require.NoError(t, err)
	require.GreaterOrEqual(t, after, before)
	require.Zero(t, n.AppliedByFSM(), "no entry may be applied twice")

	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(50), tp.LastSequence)
		return nil
	}))
	proposeAs[any](t, n, sendHalf("orders", "new", "shop", "txnew", 1000))
	require.Equal(t, uint64(1), n.AppliedByFSM())
}

// Snapshot, truncate, then a node whose store is gone catches up from the
// snapshot plus the log after it.
func TestSnapshotAndRestore(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.TrailingLogs = 1
	n := openLeader(t, cfg)
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("m%02d", i)
		proposeAs[any](t, n, sendHalf("orders", id, "shop", "tx"+id, int64(i)))
	}
	_, err := n.Snapshot()
	require.NoError(t, err)
	proposeAs[any](t, n, resolveCmd("m00", raftpb.Resolution_RESOLUTION_COMMIT, 100))
	require.NoError(t, n.Close())

	// A snapshot is a whole store: restoring it into a fresh store gives
	// the same data.
	snaps, err := raft.NewFileSnapshotStore(dir, 2, io.Discard)
	require.NoError(t, err)
	list, err := snaps.List()
	require.NoError(t, err)
	require.NotEmpty(t, list)
	_, rc, err := snaps.Open(list[0].ID)
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = io.Copy(&buf, rc)
	require.NoError(t, err)
	rc.Close()

	other, err := halfstore.Open(t.TempDir() + "/fsm.db")
	require.NoError(t, err)
	require.NoError(t, other.Restore(&buf))
	idx, err := other.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, list[0].Index, idx)
	require.NoError(t, other.View(func(tx *halfstore.Tx) error {
		hs, err := tx.ListHalf("", storepb.HalfState_HALF_STATE_PENDING, "", 100)
		require.NoError(t, err)
		require.Len(t, hs, 20)
		return nil
	}))
	require.NoError(t, other.Close())

	// Lose the store: the node restores the snapshot on open, then replays
	// the commit made after it.
	require.NoError(t, removeStore(dir))
	n = openLeader(t, cfg)
	defer n.Close()
	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		h, err := tx.Half("m00")
		require.NoError(t, err)
		require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, h.State)
		h, err = tx.Half("m19")
		require.NoError(t, err)
		require.Equal(t, storepb.HalfState_HALF_STATE_PENDING, h.State)
		return nil
	}))
}

// A store left unsynced by another boot (a power cut) is discarded and
// rebuilt from the newest snapshot and the log after it: everything
// committed is back, and only the entries after the snapshot are applied.
func TestPowerCutRebuildsStore(t *testing.T) {
	if _, err := os.Stat("/proc/sys/kernel/random/boot_id"); err != nil {
		t.Skip("no boot ID on this system: the store is fsynced on every batch")
	}
	dir := t.TempDir()
	cfg := testConfig(dir)
	cfg.TrailingLogs = 1
	n := openLeader(t, cfg)
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("m%02d", i)
		proposeAs[any](t, n, sendHalf("orders", id, "shop", "tx"+id, int64(i)))
	}
	_, err := n.Snapshot()
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		proposeAs[any](t, n, resolveCmd(fmt.Sprintf("m%02d", i), raftpb.Resolution_RESOLUTION_COMMIT, 100))
	}
	require.NoError(t, n.Close())
	require.NoError(t, os.WriteFile(filepath.Join(dir, "fsm.db.unsynced"), []byte("a boot before the power cut\n"), 0o600))

	n = openLeader(t, cfg)
	defer n.Close()
	require.Equal(t, uint64(5), n.AppliedByFSM(), "the entries after the snapshot are applied again")
	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		for i := 0; i < 20; i++ {
			h, err := tx.Half(fmt.Sprintf("m%02d", i))
			require.NoError(t, err)
			want := storepb.HalfState_HALF_STATE_PENDING
			if i < 5 {
				want = storepb.HalfState_HALF_STATE_COMMITTED
			}
			require.Equal(t, want, h.State, "m%02d", i)
		}
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(5), tp.LastSequence)
		return nil
	}))
}

func TestProposeAfterClose(t *testing.T) {
	n := openLeader(t, testConfig(t.TempDir()))
	require.NoError(t, n.Close())
	_, err := proposeCmd[any](context.Background(), n, sendHalf("orders", "m1", "shop", "tx1", 1))
	require.True(t, errors.Is(err, ErrShutdown) || errors.Is(err, ErrNotLeader), "got %v", err)
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Dir: "d", RaftAddr: "a"}, "NodeID"},
		{Config{NodeID: "n", RaftAddr: "a"}, "Dir"},
		{Config{NodeID: "n", Dir: "d"}, "RaftAddr"},
		{Config{NodeID: "n", Dir: "d", RaftAddr: "a", MaxAppendEntries: 5000}, "MaxAppendEntries"},
	} {
		err := tc.cfg.Defaults().Validate()
		require.ErrorContains(t, err, tc.want)
	}
}

// Concurrent proposals share log writes: fewer batches than entries.
func BenchmarkProposeParallel(b *testing.B) {
	n, err := Open(testConfig(b.TempDir()))
	require.NoError(b, err)
	defer n.Close()
	ctx := context.Background()
	require.NoError(b, n.WaitLeader(ctx))
	var mu sync.Mutex
	i := 0
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			mu.Lock()
			i++
			id := fmt.Sprintf("m%09d", i)
			mu.Unlock()
			if _, err := proposeCmd[any](ctx, n, sendHalf("bench", id, "g", id, 1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func removeStore(dir string) error { return os.Remove(filepath.Join(dir, "fsm.db")) }

// Concurrent proposals share log writes and store transactions: 64
// producers at once take far fewer than 64 bbolt commits.
func TestConcurrentProposalsAreBatched(t *testing.T) {
	n := openLeader(t, testConfig(t.TempDir()))
	defer n.Close()
	before := n.AppliedBatches()
	const producers = 64
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, producers)
	for i := 0; i < producers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			id := fmt.Sprintf("m%02d", i)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := proposeCmd[any](ctx, n, sendHalf("orders", id, "shop", id, 1))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	batches := n.AppliedBatches() - before
	t.Logf("%d proposals applied in %d store transactions", producers, batches)
	require.Less(t, batches, uint64(producers/2))
}
