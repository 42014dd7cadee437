package broker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/internal/txmqtest"
)

func TestClusterFollowerRedirectsToTheLeader(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.Leader()
	f := c.Follower()
	ctx := ctxT(t)
	_, err := f.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, leader.Addr(), leaderNamed(t, err), "the refusal names the leader's gRPC address")
	_, raftAddr := f.Node().Leader()
	msg := status.Convert(err).Message()
	require.Contains(t, msg, "the leader is "+leader.Node().ID()+" at "+leader.Addr(), "the message names the gRPC address too")
	require.NotContains(t, msg, raftAddr, "and not the Raft address, which a client cannot call")

	// Half message reads are linearizable: the leader serves them.
	_, err = f.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, leader.Addr(), leaderNamed(t, err))
	_, err = leader.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{})
	require.NoError(t, err)

	st, err := f.admin.ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
	require.NoError(t, err)
	require.Equal(t, "FOLLOWER", st.State)
	require.Equal(t, leader.Addr(), st.LeaderAddress)
	require.Len(t, st.Nodes, 3)
	states := map[string]int{}
	for _, n := range st.Nodes {
		require.True(t, n.Reachable, n.Id)
		require.NotZero(t, n.AppliedIndex, n.Id)
		require.LessOrEqual(t, n.Lag, uint64(5), n.Id)
		states[n.State]++
	}
	require.Equal(t, map[string]int{"LEADER": 1, "FOLLOWER": 2}, states)
	c.VerifyStores()
}

// Acknowledged writes survive the leader going away; the new leader has
// them all, delivers them, and takes new writes.
func TestClusterLeaderFailover(t *testing.T) {
	testLeaderFailover(t, newCluster(t, 3, nil), nil)
}

// testLeaderFailover commits through the leader, stops it, and checks
// that the new leader has every acknowledged commit and takes writes. The
// test's clients dial with creds when set.
func testLeaderFailover(t *testing.T, c *cluster, creds credentials.TransportCredentials) {
	leader := c.Leader()
	if creds != nil {
		require.NoError(t, leader.dial(creds))
	}
	ctx := ctxT(t)
	var ids []string
	for i := 0; i < 50; i++ {
		id := sendHalf(t, leader, "orders", "shop", fmt.Sprint("tx", i), fmt.Sprint("body", i))
		_, err := end(leader, ctx, id, txmqv1.Resolution_RESOLUTION_COMMIT)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	pending := sendHalf(t, leader, "orders", "shop", "pending", "p")
	old := leader.Node().ID()
	c.Stop(old)

	leader = c.Leader()
	require.NotEqual(t, old, leader.Node().ID())
	if creds != nil {
		require.NoError(t, leader.dial(creds))
	}
	h, err := leader.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: pending})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.Message.State)
	sub := subscribe(t, leader, "orders", "points", 100)
	got := map[string]bool{}
	for range ids {
		d := sub.next(10 * time.Second)
		require.NotNil(t, d)
		got[d.MessageId] = true
	}
	for _, id := range ids {
		require.True(t, got[id], "acknowledged commit %s lost", id)
	}
	_, err = end(leader, ctx, pending, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err, "the new leader takes writes")

	// The old leader comes back as a follower and converges.
	c.Start(old)
	c.VerifyStores()
}

// A node wiped clean joins again and catches up from a snapshot, the log
// behind it having been truncated; a fourth node joins and one is removed.
func TestClusterMembershipAndSnapshotCatchUp(t *testing.T) {
	c := newCluster(t, 3, nil)
	ctx := ctxT(t)
	sendSome(t, c, nil, "m", 100)
	_, err := c.Leader().admin.TakeSnapshot(ctx, &txmqv1.TakeSnapshotRequest{})
	require.NoError(t, err)

	c.Start("n4", c.Follower().Addr())
	c.WaitMembers(4)
	c.VerifyStores()

	victim := c.Follower()
	id := victim.Node().ID()
	_, err = c.Leader().admin.RemoveNode(ctx, &txmqv1.RemoveNodeRequest{NodeId: id})
	require.NoError(t, err)
	c.Stop(id)
	c.WaitMembers(3)

	// Wipe it and bring it back: it joins again, from a snapshot.
	c.Wipe(id)
	c.Start(id, c.Leader().Addr())
	c.WaitMembers(4)
	c.VerifyStores()
}

func TestClusterTransferLeadership(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.Leader()
	target := c.Follower()
	resp, err := leader.admin.TransferLeadership(ctxT(t), &txmqv1.TransferLeadershipRequest{NodeId: target.Node().ID()})
	require.NoError(t, err)
	require.Equal(t, target.Node().ID(), resp.LeaderId)
	require.Equal(t, target.Node().ID(), c.Leader().Node().ID())
	c.VerifyStores()
}

// sendSome writes n keyed messages through the leader among the nodes
// other than except, retrying what fails the way a client does (the key
// makes a repeat the same message): a loaded machine may elect in between,
// and these writes are the data a test works on, not what it checks.
func sendSome(t *testing.T, c *cluster, except *testBroker, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		req := &txmqv1.SendRequest{Topic: "t", Key: fmt.Sprint(prefix, i), Body: []byte(fmt.Sprint(prefix, i))}
		txmqtest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
			leader, err := leaderExcept(c, except)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err = leader.producer.Send(ctx, req)
			return err
		})
	}
}

// leaderExcept is a running node other than except that believes it
// leads.
func leaderExcept(c *cluster, except *testBroker) (*testBroker, error) {
	for _, n := range c.Nodes() {
		if n != except && n.Node().IsLeader() {
			return n, nil
		}
	}
	return nil, fmt.Errorf("no leader (other than %v)", except)
}

// isolate drops what old sends to the other nodes (and, with both, what
// they send to it), sends through old writes that must not be
// acknowledged, and returns the leader the others elect.
func isolate(t *testing.T, c *cluster, fn *txmqtest.FaultNet, old *testBroker, both bool) *testBroker {
	t.Helper()
	for _, n := range c.Nodes() {
		if n != old {
			fn.Drop(c.RaftAddr(old.Node().ID()), c.RaftAddr(n.Node().ID()))
			if both {
				fn.Drop(c.RaftAddr(n.Node().ID()), c.RaftAddr(old.Node().ID()))
			}
		}
	}
	ctx := ctxT(t)
	acked := 0
	for i := 0; i < 5; i++ {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := old.producer.Send(wctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint("minority-", i))}); err == nil {
			acked++
		}
		cancel()
	}
	require.Zero(t, acked, "a leader whose messages do not reach the majority acknowledged writes")

	var leader *testBroker
	txmqtest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		var err error
		leader, err = leaderExcept(c, old)
		return err
	})
	return leader
}

// afterHeal checks, once the links healed and the stores agree, that the
// old leader follows and that none of the writes refused while it was cut
// off reached the log.
func afterHeal(t *testing.T, c *cluster, old *testBroker) {
	t.Helper()
	c.VerifyStores()
	require.False(t, old.Node().IsLeader())
	require.NoError(t, c.Leader().Node().Store().View(func(tx *halfstore.Tx) error {
		msgs, err := tx.ReadTopic("t", 1, 1<<20)
		for _, m := range msgs {
			require.NotContains(t, string(m.Body), "minority-", "message %d: a write refused on the minority side reached the log", m.Sequence)
		}
		return err
	}))
}

// The leader is cut off from the majority: it acknowledges no write, the
// majority elects a new leader that takes writes, and once the links heal
// the old leader follows and every node holds the same data.
func TestClusterPartitionedLeader(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	c := newCluster(t, 3, nil, txmqtest.Faults(fn))
	sendSome(t, c, nil, "before-", 20)
	old := c.Leader()
	isolate(t, c, fn, old, true)
	sendSome(t, c, old, "after-", 20)
	fn.Heal()
	afterHeal(t, c, old)
}

// What the leader sends is lost, while it still hears the others: its
// writes are not acknowledged, the others elect a leader (whose requests
// the old one receives and follows, its answers lost), and once healed
// every node holds the same data.
func TestClusterLeaderLosesWhatItSends(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	c := newCluster(t, 3, nil, txmqtest.Faults(fn))
	sendSome(t, c, nil, "before-", 20)
	old := c.Leader()
	isolate(t, c, fn, old, false)
	sendSome(t, c, old, "after-", 20)
	// The old leader hears the new one: it steps down. It catches up only
	// if the new leader's first request happens to match its log: one that
	// does not is refused, and the refusal (which would make the leader
	// send older entries) is lost, so catching up waits for the heal.
	txmqtest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		if old.Node().IsLeader() {
			return errors.New("the old leader still leads")
		}
		return nil
	})
	fn.Heal()
	afterHeal(t, c, old)
}

// Every link is slow and uneven: writes are acknowledged all the same, and
// the stores agree.
func TestClusterSlowLinks(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	c := newCluster(t, 3, nil, txmqtest.Faults(fn))
	for _, a := range c.Nodes() {
		for _, b := range c.Nodes() {
			if a != b {
				fn.Delay(c.RaftAddr(a.Node().ID()), c.RaftAddr(b.Node().ID()), 10*time.Millisecond, 5*time.Millisecond)
			}
		}
	}
	sendSome(t, c, nil, "slow-", 20)
	c.VerifyStores()
}

// A leader that hands over before it stops leaves a leader behind: the
// others do not wait an election timeout, and what was acknowledged stays.
func TestClusterHandOverBeforeStopping(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.Leader()
	ctx := ctxT(t)
	id := sendHalf(t, leader, "orders", "shop", "tx1", "b")
	_, err := end(leader, ctx, id, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err)
	old := leader.Node().ID()
	require.NoError(t, leader.HandOver(ctx))
	require.False(t, leader.Node().IsLeader(), "the old leader stepped down")
	c.Stop(old)
	// The node it handed over to may still be counting its votes: a leader
	// is there well within an election timeout (200 ms, RaftTimings), which
	// the others would otherwise wait out after the old leader's last
	// heartbeat.
	var newLeader *testBroker
	txmqtest.CheckFor(t, 150*time.Millisecond, time.Millisecond, func() error {
		var ok bool
		if newLeader, ok = c.CurrentLeader(); !ok {
			return errors.New("no leader yet")
		}
		return nil
	})
	h, err := newLeader.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, h.Message.State)

	// A single node, or a follower, has nothing to hand over.
	require.NoError(t, c.Follower().HandOver(ctx))
	c.VerifyStores()
}

// leaderNamed is the leader address of the NotLeader detail of err.
func leaderNamed(t *testing.T, err error) string {
	t.Helper()
	for _, d := range status.Convert(err).Details() {
		if nl, ok := d.(*txmqv1.NotLeader); ok {
			return nl.GetLeaderAddress()
		}
	}
	t.Fatalf("%v has no NotLeader detail", err)
	return ""
}
