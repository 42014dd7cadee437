package raftlog_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

func TestMain(m *testing.M) { txmqtest.VerifyTestMain(m) }

// single starts one Raft node of the harness, configured by configure
// when set.
func single(t testing.TB, configure func(*raftlog.Config)) *txmqtest.Cluster[txmqtest.RaftNode] {
	return txmqtest.NewCluster(t, 1, txmqtest.OpenRaft(configure))
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// proposeHalf stores a half message at the leader's time now.
func proposeHalf(ctx context.Context, n *raftlog.Node, topic, id, group, tx string, now int64) (raftlog.HalfResult, error) {
	return n.SendHalf(ctx, time.Unix(0, now), &raftpb.SendHalf{
		Topic: topic, MessageId: id, ProducerGroup: group, TransactionId: tx,
		Body: []byte("body-" + tx), CreateTopic: true, CheckAfter: int64(6 * time.Second),
	})
}

func proposeResolve(ctx context.Context, n *raftlog.Node, id string, r raftpb.Resolution, now int64) (raftlog.HalfResult, error) {
	return n.Resolve(ctx, time.Unix(0, now), &raftpb.Resolve{MessageId: id, Resolution: r, Source: storepb.Source_SOURCE_PRODUCER})
}

// mustSendHalf and mustCommit fail the test when the proposal fails.
func mustSendHalf(t *testing.T, n *raftlog.Node, topic, id, group, tx string, now int64) raftlog.HalfResult {
	t.Helper()
	r, err := proposeHalf(ctxT(t), n, topic, id, group, tx, now)
	require.NoError(t, err)
	return r
}

func mustCommit(t *testing.T, n *raftlog.Node, id string, now int64) raftlog.HalfResult {
	t.Helper()
	r, err := proposeResolve(ctxT(t), n, id, raftpb.Resolution_RESOLUTION_COMMIT, now)
	require.NoError(t, err)
	return r
}

func TestProposeLifecycle(t *testing.T) {
	n := single(t, nil).Leader().Node()

	r := mustSendHalf(t, n, "orders", "m1", "shop", "tx1", 100)
	require.True(t, r.Changed)
	require.Equal(t, "m1", r.Half.Id)
	require.Equal(t, storepb.HalfState_HALF_STATE_PENDING, r.Half.State)

	r = mustSendHalf(t, n, "orders", "m2", "shop", "tx1", 101)
	require.False(t, r.Changed, "same group + tx is the same message")
	require.Equal(t, "m1", r.Half.Id)

	r = mustCommit(t, n, "m1", 200)
	require.Equal(t, uint64(1), r.Half.Sequence)

	_, err := proposeResolve(ctxT(t), n, "m1", raftpb.Resolution_RESOLUTION_ROLLBACK, 300)
	require.ErrorIs(t, err, halfstore.ErrConflict)
	require.ErrorIs(t, err, raftlog.ErrRefused)
	require.ErrorContains(t, err, "COMMITTED")

	_, err = proposeResolve(ctxT(t), n, "nope", raftpb.Resolution_RESOLUTION_COMMIT, 300)
	require.ErrorIs(t, err, halfstore.ErrNotFound)

	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		msgs, err := tx.ReadTopic("orders", 1, 10)
		require.NoError(t, err)
		require.Len(t, msgs, 1)
		require.Equal(t, []byte("body-tx1"), msgs[0].Body)
		require.Equal(t, int64(200), msgs[0].CommittedAt, "the leader's stamped time, not the clock")
		return nil
	}))
}

func TestOnApplyEvents(t *testing.T) {
	var mu sync.Mutex
	var got []string
	n := single(t, func(cfg *raftlog.Config) {
		cfg.OnApply = func(evs []raftlog.Event) {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range evs {
				if e.Kind != raftlog.EventResolved {
					got = append(got, e.Topic)
				}
			}
		}
	}).Leader().Node()
	mustSendHalf(t, n, "orders", "m1", "shop", "tx1", 1)
	mu.Lock()
	require.Empty(t, got, "a half message is invisible: nothing to wake for")
	mu.Unlock()
	mustCommit(t, n, "m1", 2)
	_, err := n.Send(ctxT(t), time.Unix(0, 3), &raftpb.Send{Topic: "audit", MessageId: "m2", Body: []byte("x"), CreateTopic: true})
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"orders", "audit"}, got)
}

// The hooks hear of every proposal, log write, applied batch and snapshot.
func TestHooks(t *testing.T) {
	var mu sync.Mutex
	var stored, applied, snapshots, proposed, replicated int
	hooks := raftlog.Hooks{
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
	n := single(t, func(cfg *raftlog.Config) { cfg.Hooks = hooks }).Leader().Node()
	for i := 0; i < 5; i++ {
		mustSendHalf(t, n, "orders", fmt.Sprint("m", i), "shop", fmt.Sprint("tx", i), int64(i))
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
	c := single(t, nil)
	n := c.Leader().Node()
	for i := 0; i < 50; i++ {
		id := fmt.Sprintf("m%02d", i)
		mustSendHalf(t, n, "orders", id, "shop", "tx"+id, int64(i))
		mustCommit(t, n, id, int64(i))
	}
	before, err := n.Store().AppliedIndex()
	require.NoError(t, err)
	require.Greater(t, before, uint64(100))

	c.Restart("n1")
	n = c.Leader().Node()
	require.Equal(t, c.RaftAddr("n1"), n.RaftAddr(), "the node advertises the listener it was handed")
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
	mustSendHalf(t, n, "orders", "new", "shop", "txnew", 1000)
	require.Equal(t, uint64(1), n.AppliedByFSM())
}

// Snapshot, truncate, then a node whose store is gone catches up from the
// snapshot plus the log after it.
func TestSnapshotAndRestore(t *testing.T) {
	c := single(t, func(cfg *raftlog.Config) { cfg.TrailingLogs = 1 })
	n := c.Leader().Node()
	dir := c.Dir("n1")
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("m%02d", i)
		mustSendHalf(t, n, "orders", id, "shop", "tx"+id, int64(i))
	}
	_, err := n.Snapshot()
	require.NoError(t, err)
	mustCommit(t, n, "m00", 100)
	c.Stop("n1")

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
	c.Start("n1")
	n = c.Leader().Node()
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
	c := single(t, func(cfg *raftlog.Config) { cfg.TrailingLogs = 1 })
	n := c.Leader().Node()
	for i := 0; i < 20; i++ {
		id := fmt.Sprintf("m%02d", i)
		mustSendHalf(t, n, "orders", id, "shop", "tx"+id, int64(i))
	}
	_, err := n.Snapshot()
	require.NoError(t, err)
	for i := 0; i < 5; i++ {
		mustCommit(t, n, fmt.Sprintf("m%02d", i), 100)
	}
	c.Stop("n1")
	require.NoError(t, os.WriteFile(filepath.Join(c.Dir("n1"), "fsm.db.unsynced"), []byte("a boot before the power cut\n"), 0o600))

	c.Start("n1")
	n = c.Leader().Node()
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
	c := single(t, nil)
	n := c.Leader().Node()
	c.Stop("n1")
	_, err := proposeHalf(context.Background(), n, "orders", "m1", "shop", "tx1", 1)
	require.True(t, errors.Is(err, raftlog.ErrShutdown) || errors.Is(err, raftlog.ErrNotLeader), "got %v", err)
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  raftlog.Config
		want string
	}{
		{raftlog.Config{Dir: "d", RaftAddr: "a"}, "NodeID"},
		{raftlog.Config{NodeID: "n", RaftAddr: "a"}, "Dir"},
		{raftlog.Config{NodeID: "n", Dir: "d"}, "RaftAddr"},
		{raftlog.Config{NodeID: "n", Dir: "d", RaftAddr: "a", MaxAppendEntries: 5000}, "MaxAppendEntries"},
	} {
		err := tc.cfg.Defaults().Validate()
		require.ErrorContains(t, err, tc.want)
	}
	// A listener handed over stands for RaftAddr.
	require.NoError(t, raftlog.Config{NodeID: "n", Dir: "d", Listener: txmqtest.Listen(t)}.Defaults().Validate())
}

// Concurrent proposals share log writes: fewer batches than entries.
func BenchmarkProposeParallel(b *testing.B) {
	n := single(b, nil).Leader().Node()
	ctx := context.Background()
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
			if _, err := proposeHalf(ctx, n, "bench", id, "g", id, 1); err != nil {
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
	n := single(t, nil).Leader().Node()
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
			_, err := proposeHalf(ctx, n, "orders", id, "shop", id, 1)
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

// Concurrent proposals become fewer log entries than proposals, and each
// caller gets its own result.
func TestConcurrentProposalsShareEntries(t *testing.T) {
	n := single(t, nil).Leader().Node()
	before, err := n.Status()
	require.NoError(t, err)
	const producers = 64
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]raftlog.HalfResult, producers)
	errs := make([]error, producers)
	for i := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			// Every other producer repeats the transaction of the one
			// before it: the first stores it, the repeat finds it.
			tx := fmt.Sprint("tx", i/2)
			results[i], errs[i] = n.SendHalf(ctx, time.Unix(0, int64(i)), &raftpb.SendHalf{
				Topic: "orders", MessageId: fmt.Sprint("m", i), ProducerGroup: "shop", TransactionId: tx,
				Body: []byte("x"), CreateTopic: true, CheckAfter: int64(time.Second),
			})
		}()
	}
	close(start)
	wg.Wait()
	stored := map[string]string{}
	for i := range producers {
		require.NoError(t, errs[i])
		h := results[i].Half
		require.Equal(t, fmt.Sprint("tx", i/2), h.TransactionId, "producer %d got another's result", i)
		if prev, ok := stored[h.TransactionId]; ok {
			require.Equal(t, prev, h.Id, "one message per transaction")
		}
		stored[h.TransactionId] = h.Id
	}
	require.Len(t, stored, producers/2)
	after, err := n.Status()
	require.NoError(t, err)
	entries := after.LastLogIndex - before.LastLogIndex
	t.Logf("%d proposals in %d log entries", producers, entries)
	require.Less(t, entries, uint64(producers/2))
	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		require.Equal(t, producers/2, tx.CountState(storepb.HalfState_HALF_STATE_PENDING))
		return nil
	}))
}

// closedLoopEntries runs writers that each propose rounds SendHalfs, the
// next as soon as the last is answered, each as a raftlog.Writer of its
// own or all without one, and returns how many log entries they took.
func closedLoopEntries(t *testing.T, n *raftlog.Node, writers, rounds int, own bool) uint64 {
	before, err := n.Status()
	require.NoError(t, err)
	var wg sync.WaitGroup
	for w := range writers {
		ctx := ctxT(t)
		if own {
			ctx = raftlog.AsWriter(ctx, new(raftlog.Writer))
		}
		wg.Go(func() {
			for i := range rounds {
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := proposeHalf(ctx, n, "orders", id, "shop", id, int64(i+1)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	after, err := n.Status()
	require.NoError(t, err)
	return after.LastLogIndex - before.LastLogIndex
}

// Writers who write again as soon as they are answered share one entry a
// round: the batcher waits for those the last entry answered instead of
// proposing the ones already waiting without them, which splits the
// writers into two halves taking turns, one entry each a round. So do
// writers told apart (each a producer's session) and writers that are not.
func TestWritersWhoComeBackShareEntries(t *testing.T) {
	const writers, rounds = 8, 40
	for _, own := range []bool{true, false} {
		t.Run(fmt.Sprintf("own writers %v", own), func(t *testing.T) {
			n := single(t, func(c *raftlog.Config) { c.Regroup = 500 * time.Millisecond }).Leader().Node()
			entries := closedLoopEntries(t, n, writers, rounds, own)
			t.Logf("%d writers, %d rounds: %d log entries", writers, rounds, entries)
			require.LessOrEqual(t, entries, uint64(rounds+rounds/4))
		})
	}
}

// A proposal whose caller gave up before it was proposed is left out.
func TestProposalCancelledBeforeProposing(t *testing.T) {
	n := single(t, nil).Leader().Node()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := n.SendHalf(ctx, time.Unix(0, 1), &raftpb.SendHalf{
		Topic: "orders", MessageId: "m1", ProducerGroup: "shop", TransactionId: "tx1", Body: []byte("x"), CreateTopic: true,
	})
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, n.Store().View(func(tx *halfstore.Tx) error {
		_, err := tx.HalfIDByTx("shop", "tx1")
		require.ErrorIs(t, err, halfstore.ErrNotFound)
		return nil
	}))
}

// ackSetup makes a node whose proposals made with MayWait wait for company
// up to linger, with a committed message (orders, sequence 1) and a group g
// to ack it in.
func ackSetup(t *testing.T, linger time.Duration) *raftlog.Node {
	n := single(t, func(c *raftlog.Config) { c.Linger = linger }).Leader().Node()
	mustSendHalf(t, n, "orders", "m1", "shop", "tx1", 1)
	mustCommit(t, n, "m1", 2)
	_, err := n.CreateGroup(ctxT(t), time.Unix(0, 3), &raftpb.CreateGroup{Topic: "orders", Group: "g"})
	require.NoError(t, err)
	return n
}

// ackAsync acks sequence 1 in g, made with MayWait, as the broker acks.
func ackAsync(t *testing.T, n *raftlog.Node) <-chan error {
	acked := make(chan error, 1)
	go func() {
		_, err := n.Ack(raftlog.MayWait(ctxT(t)), time.Unix(0, 4), &raftpb.Ack{Topic: "orders", Group: "g", Sequences: []uint64{1}})
		acked <- err
	}()
	return acked
}

// An ack that comes while writes are coming waits for the next write and
// rides in its log entry, instead of taking one of its own.
func TestAckRidesWithTheNextWrite(t *testing.T) {
	n := ackSetup(t, time.Minute)
	before, err := n.Status()
	require.NoError(t, err)
	acked := ackAsync(t, n)
	select {
	case err := <-acked:
		t.Fatalf("the ack went alone (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Should the ack not have reached the batcher yet, the next write goes
	// without it and the ack waits for the one after.
	writes := 0
	for done := false; !done; {
		writes++
		mustSendHalf(t, n, "orders", fmt.Sprint("w", writes), "shop", fmt.Sprint("txw", writes), int64(4+writes))
		select {
		case err := <-acked:
			require.NoError(t, err)
			done = true
		case <-time.After(time.Second):
		}
	}
	after, err := n.Status()
	require.NoError(t, err)
	require.Equal(t, uint64(writes), after.LastLogIndex-before.LastLogIndex, "the ack had no entry of its own")
}

// An ack with no write lately goes at once: nothing would come to share
// its entry, and a consumer draining a backlog would only wait. (On a node
// that wrote nothing yet; the ack is refused, which is an answer too.)
func TestAckWithoutTrafficGoesAtOnce(t *testing.T) {
	n := single(t, func(c *raftlog.Config) { c.Linger = time.Minute }).Leader().Node()
	select {
	case err := <-ackAsync(t, n):
		require.ErrorIs(t, err, raftlog.ErrRefused)
		require.ErrorIs(t, err, halfstore.ErrNotFound)
	case <-time.After(5 * time.Second):
		t.Fatal("the ack waited for company with no write in the last linger")
	}
}

// An ack whose company does not come goes when its linger runs out.
func TestAckGoesWhenItsLingerRunsOut(t *testing.T) {
	n := ackSetup(t, 50*time.Millisecond)
	select {
	case err := <-ackAsync(t, n):
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("the ack was not answered after its linger")
	}
}

// A proposal waiting for company when its node closes is answered, not
// left waiting out its linger.
func TestWaitingProposalAnsweredOnClose(t *testing.T) {
	c := single(t, func(cfg *raftlog.Config) { cfg.Linger = time.Minute })
	n := c.Leader().Node()
	mustSendHalf(t, n, "orders", "m1", "shop", "tx1", 1)
	acked := ackAsync(t, n)
	select {
	case err := <-acked:
		t.Fatalf("the ack went alone (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	c.Stop("n1")
	select {
	case err := <-acked:
		require.True(t, errors.Is(err, raftlog.ErrShutdown) || errors.Is(err, raftlog.ErrNotLeader), "got %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting ack was not answered when the node closed")
	}
}
