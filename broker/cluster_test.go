package broker

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
)

// cluster is an in-process cluster on 127.0.0.1:0.
type cluster struct {
	t     *testing.T
	nodes map[string]*testBroker
	dirs  map[string]string
	raft  map[string]string // a node keeps its Raft address across restarts
	// net, when set, carries the Raft traffic so that links can be cut.
	net *faultNet
	// configure, when set, adjusts each node's config before it starts.
	configure func(id string, cfg *Config)
}

func clusterConfig(id, dir string, join []string) Config {
	cfg := testConfig(dir)
	cfg.Raft.NodeID = id
	cfg.Raft.Bootstrap = len(join) == 0
	// Timers long enough that a loaded 2-core CI machine does not see
	// leaders flap, short enough for quick failovers.
	cfg.Raft.HeartbeatTimeout = 200 * time.Millisecond
	cfg.Raft.ElectionTimeout = 200 * time.Millisecond
	cfg.Raft.LeaderLeaseTimeout = 200 * time.Millisecond
	cfg.Raft.SnapshotThreshold = 64
	cfg.Raft.TrailingLogs = 16
	cfg.Join = join
	return cfg
}

func newCluster(t *testing.T, n int) *cluster {
	return newClusterOn(t, n, nil)
}

func newClusterOn(t *testing.T, n int, fn *faultNet) *cluster {
	return newClusterWith(t, n, fn, nil)
}

func newClusterWith(t *testing.T, n int, fn *faultNet, configure func(id string, cfg *Config)) *cluster {
	c := &cluster{t: t, nodes: map[string]*testBroker{}, dirs: map[string]string{}, raft: map[string]string{}, net: fn, configure: configure}
	c.start("n1", nil)
	for i := 2; i <= n; i++ {
		c.start(fmt.Sprint("n", i), []string{c.nodes["n1"].Addr()})
	}
	c.waitMembers(n)
	return c
}

func (c *cluster) start(id string, join []string) *testBroker {
	c.t.Helper()
	if c.dirs[id] == "" {
		c.dirs[id] = c.t.TempDir()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(c.t, err)
		c.raft[id] = l.Addr().String()
		l.Close()
	}
	cfg := clusterConfig(id, c.dirs[id], join)
	cfg.Raft.RaftAddr = c.raft[id]
	if c.net != nil {
		layer, err := c.net.layer(c.raft[id])
		require.NoError(c.t, err)
		cfg.Raft.StreamLayer = layer
	}
	if c.configure != nil {
		c.configure(id, &cfg)
	}
	b, err := Open(cfg)
	require.NoError(c.t, err)
	tb := &testBroker{Broker: b}
	tb.dial(c.t)
	c.nodes[id] = tb
	c.t.Cleanup(tb.stop)
	return tb
}

func (c *cluster) stop(id string) {
	c.nodes[id].stop()
	delete(c.nodes, id)
}

// checkFor polls f until it returns nil or total passes.
func checkFor(t *testing.T, total, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", total, err)
		}
		time.Sleep(every)
	}
}

// leader waits until the running nodes agree on a leader and returns it.
func (c *cluster) leader() *testBroker {
	c.t.Helper()
	var leader *testBroker
	checkFor(c.t, 15*time.Second, 20*time.Millisecond, func() error {
		leader = nil
		for _, n := range c.nodes {
			if n.Node().IsLeader() {
				leader = n
			}
		}
		if leader == nil {
			return fmt.Errorf("no leader")
		}
		for id, n := range c.nodes {
			if l, _ := n.Node().Leader(); l != leader.Node().ID() {
				return fmt.Errorf("%s follows %q", id, l)
			}
		}
		return nil
	})
	return leader
}

func (c *cluster) follower() *testBroker {
	leader := c.leader()
	for _, n := range c.nodes {
		if n != leader {
			return n
		}
	}
	c.t.Fatal("no follower")
	return nil
}

// waitMembers waits until every running node knows n voters, each with its
// gRPC address.
func (c *cluster) waitMembers(n int) {
	c.t.Helper()
	checkFor(c.t, 20*time.Second, 20*time.Millisecond, func() error {
		for id, node := range c.nodes {
			st, err := node.admin.ClusterStatus(context.Background(), &txmqv1.ClusterStatusRequest{})
			if err != nil {
				return err
			}
			if len(st.Nodes) != n {
				return fmt.Errorf("%s sees %d members", id, len(st.Nodes))
			}
			for _, m := range st.Nodes {
				if m.GrpcAddress == "" {
					return fmt.Errorf("%s does not know %s's gRPC address", id, m.Id)
				}
			}
		}
		return nil
	})
}

// dump is a node's store content, for comparing nodes.
func dump(t *testing.T, tb *testBroker) map[string]string {
	out := map[string]string{}
	require.NoError(t, tb.Node().Store().View(func(tx *halfstore.Tx) error {
		topics, err := tx.Topics()
		if err != nil {
			return err
		}
		for _, tp := range topics {
			msgs, err := tx.ReadTopic(tp.Name, 1, 1<<20)
			if err != nil {
				return err
			}
			for _, m := range msgs {
				out[fmt.Sprintf("%s/%d", tp.Name, m.Sequence)] = m.Id + ":" + string(m.Body)
			}
		}
		hs, err := tx.ListHalf("", 0, "", 1<<20)
		for _, h := range hs {
			out["half/"+h.Id] = h.State.String()
		}
		return err
	}))
	return out
}

func TestClusterFollowerRedirectsToTheLeader(t *testing.T) {
	c := newCluster(t, 3)
	leader := c.leader()
	f := c.follower()
	ctx := ctxT(t)
	_, err := f.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")})
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, leader.Addr(), leaderNamed(t, err), "the refusal names the leader's gRPC address")

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
}

// Acknowledged writes survive the leader going away; the new leader has
// them all, delivers them, and takes new writes.
func TestClusterLeaderFailover(t *testing.T) {
	c := newCluster(t, 3)
	leader := c.leader()
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
	c.stop(old)

	leader = c.leader()
	require.NotEqual(t, old, leader.Node().ID())
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
	c.start(old, nil)
	checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		want := dump(t, c.leader())
		for id, n := range c.nodes {
			if got := dump(t, n); fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s differs from the leader", id)
			}
		}
		return nil
	})
}

// A node wiped clean joins again and catches up from a snapshot, the log
// behind it having been truncated; a fourth node joins and one is removed.
func TestClusterMembershipAndSnapshotCatchUp(t *testing.T) {
	c := newCluster(t, 3)
	leader := c.leader()
	ctx := ctxT(t)
	for i := 0; i < 100; i++ {
		_, err := leader.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint(i))})
		require.NoError(t, err)
	}
	_, err := leader.admin.TakeSnapshot(ctx, &txmqv1.TakeSnapshotRequest{})
	require.NoError(t, err)

	n4 := c.start("n4", []string{c.follower().Addr()})
	c.waitMembers(4)
	checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		if got, want := dump(t, n4), dump(t, c.leader()); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("n4 has %d entries, the leader %d", len(got), len(want))
		}
		return nil
	})

	victim := c.follower()
	id := victim.Node().ID()
	_, err = c.leader().admin.RemoveNode(ctx, &txmqv1.RemoveNodeRequest{NodeId: id})
	require.NoError(t, err)
	c.stop(id)
	c.waitMembers(3)

	// Wipe it and bring it back: it joins again, from a snapshot.
	require.NoError(t, os.RemoveAll(c.dirs[id]))
	require.NoError(t, os.MkdirAll(filepath.Clean(c.dirs[id]), 0o700))
	back := c.start(id, []string{c.leader().Addr()})
	c.waitMembers(4)
	checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		if got, want := dump(t, back), dump(t, c.leader()); fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("%s has %d entries, the leader %d", id, len(got), len(want))
		}
		return nil
	})
}

func TestClusterTransferLeadership(t *testing.T) {
	c := newCluster(t, 3)
	leader := c.leader()
	target := c.follower()
	resp, err := leader.admin.TransferLeadership(ctxT(t), &txmqv1.TransferLeadershipRequest{NodeId: target.Node().ID()})
	require.NoError(t, err)
	require.Equal(t, target.Node().ID(), resp.LeaderId)
	require.Equal(t, target.Node().ID(), c.leader().Node().ID())
}

// The leader is cut off from the majority: it acknowledges no write, the
// majority elects a new leader that takes writes, and once the links heal
// the old leader follows and every node holds the same data.
func TestClusterPartitionedLeader(t *testing.T) {
	fn := newFaultNet()
	c := newClusterOn(t, 3, fn)
	old := c.leader()
	ctx := ctxT(t)
	for i := 0; i < 20; i++ {
		_, err := old.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint("before-", i))})
		require.NoError(t, err)
	}
	var others []string
	for id := range c.nodes {
		if id != old.Node().ID() {
			others = append(others, c.raft[id])
		}
	}
	fn.partition(c.raft[old.Node().ID()], others...)

	// The minority side acknowledges nothing.
	acked := 0
	for i := 0; i < 5; i++ {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		if _, err := old.producer.Send(wctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint("minority-", i))}); err == nil {
			acked++
		}
		cancel()
	}
	require.Zero(t, acked, "a leader cut off from the majority acknowledged writes")

	var leader *testBroker
	checkFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		for id, n := range c.nodes {
			if id != old.Node().ID() && n.Node().IsLeader() {
				leader = n
				return nil
			}
		}
		return fmt.Errorf("no leader on the majority side")
	})
	for i := 0; i < 20; i++ {
		_, err := leader.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(fmt.Sprint("after-", i))})
		require.NoError(t, err)
	}

	fn.heal()
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		want := dump(t, leader)
		wantIdx, err := leader.Node().Store().AppliedIndex()
		if err != nil {
			return err
		}
		for id, n := range c.nodes {
			if got := dump(t, n); fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Errorf("%s's store differs from the leader's", id)
			}
			if idx, _ := n.Node().Store().AppliedIndex(); idx != wantIdx {
				return fmt.Errorf("%s applied %d, the leader %d", id, idx, wantIdx)
			}
			st, err := n.Node().Status()
			if err != nil {
				return err
			}
			lst, err := leader.Node().Status()
			if err != nil {
				return err
			}
			if st.LastLogIndex != lst.LastLogIndex || st.Term != lst.Term {
				return fmt.Errorf("%s's log ends at %d in term %d, the leader's at %d in term %d", id, st.LastLogIndex, st.Term, lst.LastLogIndex, lst.Term)
			}
		}
		return nil
	})
	require.False(t, old.Node().IsLeader())
	msgs := dump(t, leader)
	for k, v := range msgs {
		require.NotContains(t, v, "minority-", "%s: a write refused on the minority side reached the log", k)
	}
}

// A leader that hands over before it stops leaves a leader behind: the
// others do not wait an election timeout, and what was acknowledged stays.
func TestClusterHandOverBeforeStopping(t *testing.T) {
	c := newCluster(t, 3)
	leader := c.leader()
	ctx := ctxT(t)
	id := sendHalf(t, leader, "orders", "shop", "tx1", "b")
	_, err := end(leader, ctx, id, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err)
	old := leader.Node().ID()
	require.NoError(t, leader.HandOver(ctx))
	require.False(t, leader.Node().IsLeader(), "the old leader stepped down")
	c.stop(old)
	var newLeader *testBroker
	for _, n := range c.nodes {
		if n.Node().IsLeader() {
			newLeader = n
		}
	}
	require.NotNil(t, newLeader, "a leader is there as soon as the old one stopped")
	h, err := newLeader.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, h.Message.State)

	// A single node, or a follower, has nothing to hand over.
	require.NoError(t, c.follower().HandOver(ctx))
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
