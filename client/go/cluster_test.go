package txmq_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testCluster runs brokers in this process on fixed loopback ports, so
// that a stopped node comes back at the same addresses.
type testCluster struct {
	t     *testing.T
	mu    sync.Mutex
	nodes map[string]*broker.Broker
	dirs  map[string]string
	grpc  map[string]string
	raft  map[string]string
}

func newTestCluster(t *testing.T, n int) *testCluster {
	c := &testCluster{t: t, nodes: map[string]*broker.Broker{}, dirs: map[string]string{}, grpc: map[string]string{}, raft: map[string]string{}}
	var peers []raftlog.Peer
	for i := 1; i <= n; i++ {
		id := fmt.Sprint("n", i)
		c.dirs[id], c.grpc[id], c.raft[id] = t.TempDir(), freeAddr(t), freeAddr(t)
		peers = append(peers, raftlog.Peer{ID: id, RaftAddr: c.raft[id]})
	}
	for id := range c.dirs {
		c.start(id, peers, nil)
	}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, b := range c.nodes {
			b.Close()
		}
	})
	return c
}

// start starts (or restarts) a node: a new cluster's with peers, a node
// joining through join, or a restart with neither.
func (c *testCluster) start(id string, peers []raftlog.Peer, join []string) {
	c.t.Helper()
	c.mu.Lock()
	if c.dirs[id] == "" {
		c.dirs[id], c.grpc[id], c.raft[id] = c.t.TempDir(), freeAddr(c.t), freeAddr(c.t)
	}
	c.mu.Unlock()
	b, err := broker.Open(broker.Config{
		Raft: raftlog.Config{
			NodeID: id, Dir: c.dirs[id], RaftAddr: c.raft[id], Bootstrap: len(join) == 0, Peers: peers,
			HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
			LeaderLeaseTimeout: 100 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
			SnapshotThreshold: 256, TrailingLogs: 64,
		},
		GRPCAddr:    c.grpc[id],
		Join:        join,
		AckDeadline: 2 * time.Second,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	require.NoError(c.t, err)
	c.mu.Lock()
	c.nodes[id] = b
	c.mu.Unlock()
}

func (c *testCluster) addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, a := range c.grpc {
		out = append(out, a)
	}
	return out
}

func (c *testCluster) node(id string) *broker.Broker {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[id]
}

// members is the Raft configuration as the leader sees it.
func (c *testCluster) members() int {
	b := c.node(c.leaderID())
	if b == nil {
		return 0
	}
	st, err := b.Node().Status()
	if err != nil {
		return 0
	}
	return len(st.Members)
}

func (c *testCluster) leaderID() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, b := range c.nodes {
		if b.Node().IsLeader() {
			return id
		}
	}
	return ""
}

// stop closes a node without handing over leadership.
func (c *testCluster) stop(id string) {
	c.mu.Lock()
	b := c.nodes[id]
	delete(c.nodes, id)
	c.mu.Unlock()
	require.NoError(c.t, b.Close())
}

// load runs producers doing SendHalf → Commit (and a rollback in five)
// and a consumer group acking, against a cluster, while disrupt does its
// worst; then it checks that no acknowledged commit is lost, that nothing
// rolled back or uncommitted is delivered, and that every acknowledged
// commit reaches the group. It returns a one-line summary.
func load(t *testing.T, c *testCluster, duration time.Duration, disrupt func(ctx context.Context)) string {
	const producers = 4
	var (
		mu          sync.Mutex
		committed   = map[string]bool{} // acknowledged commits, by message ID
		notToGet    = map[string]bool{} // rolled back, or never committed
		delivered   = map[string]int{}
		deliveries  atomic.Int64
		lastOK      atomic.Int64
		longestGap  atomic.Int64
		commitFails atomic.Int64
	)
	noteWrite := func() {
		now := time.Now().UnixNano()
		if prev := lastOK.Swap(now); prev != 0 && now-prev > longestGap.Load() {
			longestGap.Store(now - prev)
		}
	}

	consumer, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: c.addrs(), Topic: "orders", Group: "points", Concurrency: 4, Logger: quiet})
	require.NoError(t, err)
	cctx, stopConsumer := context.WithCancel(context.Background())
	consumerDone := make(chan error, 1)
	go func() {
		consumerDone <- consumer.Run(cctx, func(ctx context.Context, d *txmq.Delivery) error {
			mu.Lock()
			delivered[d.MessageID]++
			mu.Unlock()
			deliveries.Add(1)
			return nil
		})
	}()
	defer func() {
		stopConsumer()
		<-consumerDone
		consumer.Close()
	}()

	ctx, stop := context.WithTimeout(context.Background(), duration)
	defer stop()
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prod, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: c.addrs(), ProducerGroup: "shop", RetryTimeout: 10 * time.Second, Logger: quiet})
			if err != nil {
				t.Error(err)
				return
			}
			defer prod.Close()
			for i := 0; ctx.Err() == nil; i++ {
				tx := fmt.Sprintf("p%d-%d", p, i)
				id, err := prod.SendHalf(ctx, tx, txmq.Message{Topic: "orders", Body: []byte(tx)})
				if err != nil {
					continue // not acknowledged: never committed by us
				}
				if i%5 == 4 {
					if err := prod.Rollback(ctx, id); err == nil {
						noteWrite()
					}
					mu.Lock()
					notToGet[id] = true
					mu.Unlock()
					continue
				}
				err = prod.Commit(ctx, id)
				mu.Lock()
				if err == nil {
					committed[id] = true
				} else {
					commitFails.Add(1) // unknown outcome: may or may not be delivered
				}
				mu.Unlock()
				if err == nil {
					noteWrite()
				}
			}
		}()
	}
	disrupt(ctx)
	wg.Wait()

	mu.Lock()
	want := len(committed)
	mu.Unlock()
	require.Greater(t, want, 20, "the load ran (at least a few commits, on a loaded machine too)")
	deadline := time.Now().Add(60 * time.Second)
	for {
		mu.Lock()
		var missing []string
		for id := range committed {
			if delivered[id] == 0 {
				missing = append(missing, id)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			state := "the consumer is still running"
			select {
			case err := <-consumerDone:
				state = fmt.Sprintf("the consumer's Run returned %v", err)
				consumerDone <- err
			default:
			}
			t.Fatalf("%d acknowledged commits not delivered within 60s after the load (%d deliveries seen); %s; %s",
				len(missing), deliveries.Load(), state, c.explain(missing[0]))
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for id, n := range delivered {
		require.False(t, notToGet[id], "message %s was rolled back but delivered", id)
		dups += n - 1
	}
	for id := range committed {
		require.NotZero(t, delivered[id], "acknowledged commit %s lost", id)
	}
	total := deliveries.Load()
	return fmt.Sprintf("%d acknowledged commits, %d rolled back, %d commits with unknown outcome; "+
		"%d deliveries, %.1f duplicates per 1,000; longest write outage %s",
		want, len(notToGet), commitFails.Load(), total, 1000*float64(dups)/float64(max(total, 1)),
		time.Duration(longestGap.Load()).Round(time.Millisecond))
}

// The leader of a three-node cluster is stopped every few seconds (and
// started again) during a minute of transactional load.
func TestClusterLeaderKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of load")
	}
	c := newTestCluster(t, 3)
	waitFor(t, 20*time.Second, func() bool { return c.leaderID() != "" })
	kills := 0
	summary := load(t, c, 60*time.Second, func(ctx context.Context) {
		killer := time.NewTicker(4 * time.Second)
		defer killer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-killer.C:
				id := c.leaderID()
				if id == "" {
					continue
				}
				c.stop(id)
				kills++
				c.start(id, nil, nil)
			}
		}
	})
	require.Positive(t, kills)
	t.Logf("%d leader kills in 60s; %s", kills, summary)
}

// All three nodes stop at once under load and start again: every
// acknowledged message survives.
func TestClusterRestartAllUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	c := newTestCluster(t, 3)
	waitFor(t, 20*time.Second, func() bool { return c.leaderID() != "" })
	summary := load(t, c, 15*time.Second, func(ctx context.Context) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
		ids := []string{"n1", "n2", "n3"}
		var wg sync.WaitGroup
		for _, id := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.stop(id)
			}()
		}
		wg.Wait()
		for _, id := range ids {
			c.start(id, nil, nil)
		}
		<-ctx.Done()
	})
	t.Logf("all nodes restarted once; %s", summary)
}

// Under load: a fourth node joins, a follower is removed, and another
// follower is wiped and joins again, catching up from a snapshot.
func TestClusterGrowShrinkAndRejoinUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	c := newTestCluster(t, 3)
	waitFor(t, 20*time.Second, func() bool { return c.leaderID() != "" })
	summary := load(t, c, 20*time.Second, func(ctx context.Context) {
		time.Sleep(2 * time.Second)
		c.start("n4", nil, c.addrs())
		waitFor(t, 15*time.Second, func() bool { return c.members() == 4 })

		follower := func() string {
			for _, id := range []string{"n1", "n2", "n3"} {
				if b := c.node(id); b != nil && id != c.leaderID() {
					return id
				}
			}
			return ""
		}
		// Through whichever node leads when asked: a loaded machine may
		// see an election in between.
		remove := func(id string) {
			waitFor(t, 15*time.Second, func() bool {
				l := c.node(c.leaderID())
				return l != nil && l.Node().RemoveServer(id) == nil
			})
		}
		gone := follower()
		remove(gone)
		c.stop(gone)
		waitFor(t, 15*time.Second, func() bool { return c.members() == 3 })

		// As docs/operations.md says: a wiped node forgot its votes and
		// what it acknowledged, so it leaves the configuration first and
		// joins again as a new member.
		wiped := follower()
		remove(wiped)
		c.stop(wiped)
		waitFor(t, 15*time.Second, func() bool { return c.members() == 2 })
		_, err := c.node(c.leaderID()).Node().Snapshot()
		require.NoError(t, err)
		require.NoError(t, os.RemoveAll(c.dirs[wiped]))
		c.start(wiped, nil, c.addrs())
		waitFor(t, 15*time.Second, func() bool { return c.members() == 3 })
		waitFor(t, 15*time.Second, func() bool {
			b := c.node(wiped)
			l := c.node(c.leaderID())
			if b == nil || l == nil {
				return false
			}
			mine, _ := b.Node().Store().AppliedIndex()
			theirs, _ := l.Node().Store().AppliedIndex()
			return mine > 0 && theirs-mine < 100
		})
		<-ctx.Done()
	})
	t.Logf("grew to 4, removed one, rejoined a wiped node; %s", summary)
}

// explain says where a message stands on the leader, for failure reports.
func (c *testCluster) explain(id string) string {
	b := c.node(c.leaderID())
	if b == nil {
		return "no leader"
	}
	out := "message " + id + ": "
	_ = b.Node().Store().View(func(tx *halfstore.Tx) error {
		h, err := tx.Half(id)
		if err != nil {
			out += err.Error()
			return nil
		}
		out += fmt.Sprintf("state %s seq %d", h.State, h.Sequence)
		g, err := tx.Group("orders", "points")
		if err != nil {
			out += "; " + err.Error()
			return nil
		}
		acked, _ := tx.IsAcked("orders", "points", h.Sequence)
		tp, _ := tx.Topic("orders")
		out += fmt.Sprintf("; group acked through %d (+%d above), this one acked %t; topic last %d", g.AckedThrough, g.AckedAbove, acked, tp.LastSequence)
		return nil
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	for nid, nb := range c.nodes {
		inFlight, subs := nb.DeliveryStats("orders", "points")
		out += fmt.Sprintf("; %s leader=%t in-flight=%d subscribers=%d", nid, nb.Node().IsLeader(), inFlight, subs)
	}
	return out
}
