package txmqtest_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// recorder is a testing.TB whose failures are recorded instead of failing
// the test; Fatalf ends the goroutine, as it does for a test.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.mu.Lock()
	r.failed = fmt.Sprintf(format, args...)
	r.mu.Unlock()
	runtime.Goexit()
}

// failure runs f with a recorder and returns what it failed with, "" if
// it did not.
func failure(t *testing.T, f func(tb testing.TB)) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func TestCheckForFailsWithTheLastError(t *testing.T) {
	tries := 0
	msg := failure(t, func(tb testing.TB) {
		txmqtest.CheckFor(tb, 50*time.Millisecond, time.Millisecond, func() error {
			tries++
			return fmt.Errorf("try %d", tries)
		})
	})
	require.Contains(t, msg, fmt.Sprintf("try %d", tries))
	require.Greater(t, tries, 1)
	require.Empty(t, failure(t, func(tb testing.TB) {
		txmqtest.CheckFor(tb, time.Second, time.Millisecond, func() error { return nil })
	}))
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// workload writes a bit of everything VerifyStores compares through n;
// body is the body of the second message.
func workload(t *testing.T, n *raftlog.Node, body string) {
	t.Helper()
	now := time.Unix(1_800_000_000, 0)
	for i, b := range []string{"first", body, "third"} {
		_, err := n.Send(ctx(t), now, &raftpb.Send{Topic: "orders", MessageId: fmt.Sprint("m", i), Body: []byte(b), CreateTopic: true})
		require.NoError(t, err)
	}
	_, err := n.CreateGroup(ctx(t), now, &raftpb.CreateGroup{Topic: "orders", Group: "points", Start: raftpb.StartPosition_START_POSITION_EARLIEST})
	require.NoError(t, err)
	_, err = n.Ack(ctx(t), now, &raftpb.Ack{Topic: "orders", Group: "points", Sequences: []uint64{2}})
	require.NoError(t, err)
	_, err = n.RecordFailures(ctx(t), now, &raftpb.RecordFailures{Topic: "orders", Group: "points", Failures: []*raftpb.Failure{
		{Sequence: 1, Attempts: 1, Error: "boom", Dead: true},
		{Sequence: 3, Attempts: 1, Error: "later", RetryAt: now.Add(time.Minute).UnixNano()},
	}})
	require.NoError(t, err)
	for _, tx := range []string{"t1", "t2"} {
		_, err = n.SendHalf(ctx(t), now, &raftpb.SendHalf{Topic: "orders", MessageId: "h-" + tx, ProducerGroup: "shop",
			TransactionId: tx, Body: []byte("half"), CreateTopic: true, CheckAfter: int64(time.Minute)})
		require.NoError(t, err)
	}
	_, err = n.Resolve(ctx(t), now, &raftpb.Resolve{MessageId: "h-t1", Resolution: raftpb.Resolution_RESOLUTION_COMMIT, Source: storepb.Source_SOURCE_PRODUCER})
	require.NoError(t, err)
	_, err = n.UpdateProducerGroup(ctx(t), now, &raftpb.UpdateProducerGroup{Name: "shop", MaxChecks: proto.Uint32(3)})
	require.NoError(t, err)
	_, err = n.UpdateConsumerGroup(ctx(t), now, &raftpb.UpdateConsumerGroup{Name: "points", MaxDeliveries: proto.Uint32(5)})
	require.NoError(t, err)
	require.NoError(t, n.SetNode(ctx(t), &raftpb.SetNode{Id: n.ID(), GrpcAddress: "127.0.0.1:1"}))
}

// The nodes of a cluster agree after a workload; a node restarted at its
// address catches up and agrees too.
func TestClusterStoresAgree(t *testing.T) {
	c := txmqtest.NewCluster(t, 3, txmqtest.OpenRaft(nil), txmqtest.Static())
	workload(t, c.Leader().Node(), "second")
	c.VerifyStores()

	f := c.Follower()
	id, addr := f.Node().ID(), c.RaftAddr(f.Node().ID())
	c.Stop(id)
	_, err := c.Leader().Node().Send(ctx(t), time.Now(), &raftpb.Send{Topic: "orders", MessageId: "while-down", Body: []byte("x")})
	require.NoError(t, err)
	back := c.Start(id)
	require.Equal(t, addr, back.Node().RaftAddr(), "a restarted node keeps its Raft address")
	c.VerifyStores()
}

// Two single-node clusters fed the same commands agree; fed the same but
// one body (of the same length), they agree on every index and term, and
// VerifyStores names the message that differs.
func TestVerifyStoresCatchesADifference(t *testing.T) {
	a := txmqtest.NewCluster(t, 1, txmqtest.OpenRaft(nil)).Leader().Node()
	b := txmqtest.NewCluster(t, 1, txmqtest.OpenRaft(nil)).Leader().Node()
	workload(t, a, "second")
	workload(t, b, "second")
	require.Empty(t, failure(t, func(tb testing.TB) { txmqtest.VerifyStores(tb, a, b) }), "the same commands give the same stores")

	c := txmqtest.NewCluster(t, 1, txmqtest.OpenRaft(nil)).Leader().Node()
	workload(t, c, "SECOND")
	msg := failure(t, func(tb testing.TB) { txmqtest.VerifyStores(tb, a, c) })
	t.Logf("VerifyStores reported: %s", msg)
	require.Contains(t, msg, "topic orders message 2 is")
	require.Contains(t, msg, `"second"`)
	require.Contains(t, msg, `"SECOND"`)
}
