package txmq_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/internal/txmqtest"
)

// newLoadCluster starts three brokers that know each other from the start
// (static peers), at fixed addresses across restarts.
func newLoadCluster(t *testing.T) *brokers {
	return newBrokers(t, 3, func(cfg *broker.Config) {
		cfg.Raft.SnapshotThreshold = 256
		cfg.Raft.TrailingLogs = 64
		cfg.AckDeadline = 2 * time.Second
	}, txmqtest.Static())
}

// load runs producers doing SendHalf → Commit (and a rollback in five)
// and a consumer group acking, against a cluster, while disrupt does its
// worst; then it checks that no acknowledged commit is lost, that nothing
// rolled back or uncommitted is delivered, and that every acknowledged
// commit reaches the group. It returns a one-line summary.
func load(t *testing.T, c *brokers, duration time.Duration, disrupt func(ctx context.Context)) string {
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

	consumer, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: c.Addrs(), Topic: "orders", Group: "points", Concurrency: 4, Logger: txmqtest.Logger()})
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
			prod, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: c.Addrs(), ProducerGroup: "shop", RetryTimeout: 10 * time.Second, Logger: txmqtest.Logger()})
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
	txmqtest.CheckFor(t, 60*time.Second, 20*time.Millisecond, func() error {
		mu.Lock()
		var missing []string
		for id := range committed {
			if delivered[id] == 0 {
				missing = append(missing, id)
			}
		}
		mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		state := "the consumer is still running"
		select {
		case err := <-consumerDone:
			state = fmt.Sprintf("the consumer's Run returned %v", err)
			consumerDone <- err
		default:
		}
		return fmt.Errorf("%d acknowledged commits not delivered after the load (%d deliveries seen); %s; %s",
			len(missing), deliveries.Load(), state, explain(c, missing[0]))
	})
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
	c := newLoadCluster(t)
	kills := 0
	summary := load(t, c, 60*time.Second, func(ctx context.Context) {
		killer := time.NewTicker(4 * time.Second)
		defer killer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-killer.C:
				leader, ok := c.CurrentLeader()
				if !ok {
					continue
				}
				id := leader.Node().ID()
				c.Stop(id)
				kills++
				c.Start(id)
			}
		}
	})
	require.Positive(t, kills)
	t.Logf("%d leader kills in 60s; %s", kills, summary)
	c.VerifyStores()
}

// All three nodes stop at once under load and start again: every
// acknowledged message survives.
func TestClusterRestartAllUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	c := newLoadCluster(t)
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
				c.Stop(id)
			}()
		}
		wg.Wait()
		for _, id := range ids {
			c.Start(id)
		}
		<-ctx.Done()
	})
	t.Logf("all nodes restarted once; %s", summary)
	c.VerifyStores()
}

// Under load: a fourth node joins, a follower is removed, and another
// follower is wiped and joins again, catching up from a snapshot.
func TestClusterGrowShrinkAndRejoinUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	c := newLoadCluster(t)
	summary := load(t, c, 20*time.Second, func(ctx context.Context) {
		time.Sleep(2 * time.Second)
		c.Start("n4", c.Addrs()...)
		c.WaitMembers(4)

		follower := func() string {
			leader := c.Leader().Node().ID()
			for _, id := range []string{"n1", "n2", "n3"} {
				if _, ok := c.Node(id); ok && id != leader {
					return id
				}
			}
			return ""
		}
		// Through whichever node leads when asked: a loaded machine may
		// see an election in between.
		remove := func(id string) {
			txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
				l, ok := c.CurrentLeader()
				if !ok {
					return fmt.Errorf("no leader to remove %s", id)
				}
				return l.Node().RemoveServer(id)
			})
		}
		gone := follower()
		remove(gone)
		c.Stop(gone)
		c.WaitMembers(3)

		// As docs/operations.md says: a wiped node forgot its votes and
		// what it acknowledged, so it leaves the configuration first and
		// joins again as a new member.
		wiped := follower()
		remove(wiped)
		c.Stop(wiped)
		c.WaitMembers(2)
		_, err := c.Leader().Node().Snapshot()
		require.NoError(t, err)
		c.Wipe(wiped)
		b := c.Start(wiped, c.Addrs()...)
		c.WaitMembers(3)
		txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
			l, ok := c.CurrentLeader()
			if !ok {
				return fmt.Errorf("no leader")
			}
			mine, _ := b.Node().Store().AppliedIndex()
			theirs, _ := l.Node().Store().AppliedIndex()
			if mine == 0 || theirs-mine >= 100 {
				return fmt.Errorf("%s applied through %d, the leader through %d", wiped, mine, theirs)
			}
			return nil
		})
		<-ctx.Done()
	})
	t.Logf("grew to 4, removed one, rejoined a wiped node; %s", summary)
	c.VerifyStores()
}

// explain says where a message stands on the leader, for failure reports.
func explain(c *brokers, id string) string {
	b, ok := c.CurrentLeader()
	if !ok {
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
	for _, nb := range c.Nodes() {
		inFlight, subs := nb.DeliveryStats("orders", "points")
		out += fmt.Sprintf("; %s leader=%t in-flight=%d subscribers=%d", nb.Node().ID(), nb.Node().IsLeader(), inFlight, subs)
	}
	return out
}
