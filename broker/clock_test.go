package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/internal/txmqtest"
)

// testClusterClock is a cluster clock on a fake machine clock, with a
// floor and leadership the test sets.
type testClusterClock struct {
	*clusterClock
	machine *clock
	floor   atomic.Int64
	leader  atomic.Bool
}

func newTestClusterClock(t *testing.T, peers ...string) *testClusterClock {
	tc := &testClusterClock{machine: newClock()}
	floor := func() time.Time {
		if ns := tc.floor.Load(); ns != 0 {
			return time.Unix(0, ns)
		}
		return time.Time{}
	}
	tc.clusterClock = newClusterClock("n1", tc.machine.Now, floor, tc.leader.Load, txmqtest.Logger())
	tc.setPeers(peers, true)
	// The sampler's part: a new term reads the voter list again.
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			select {
			case <-tc.kick:
				tc.setPeers(peers, true)
			case <-done:
				return
			}
		}
	}()
	return tc
}

// sample records that peer's clock is off this machine's by d, now.
func (tc *testClusterClock) sample(peer string, d time.Duration) {
	tc.record(peer, clockSample{offset: d, at: tc.machine.Now()}, nil)
}

func (tc *testClusterClock) advance(d time.Duration) {
	tc.machine.mu.Lock()
	tc.machine.now = tc.machine.now.Add(d)
	tc.machine.mu.Unlock()
}

// off is how far the cluster's time is from this machine's clock.
func (tc *testClusterClock) off() time.Duration { return tc.Now().Sub(tc.machine.Now()) }

func TestClockMedian(t *testing.T) {
	// This machine is 80 h ahead: the two others, right, say so.
	tc := newTestClusterClock(t, "n2", "n3")
	tc.sample("n2", -80*time.Hour)
	tc.sample("n3", -80*time.Hour-time.Millisecond)
	require.Equal(t, -80*time.Hour, tc.off())

	// 80 h behind.
	tc = newTestClusterClock(t, "n2", "n3")
	tc.sample("n2", 80*time.Hour)
	tc.sample("n3", 80*time.Hour+time.Millisecond)
	require.Equal(t, 80*time.Hour, tc.off())

	// One other voter far off: the two that agree win.
	tc = newTestClusterClock(t, "n2", "n3")
	tc.sample("n2", 5*time.Millisecond)
	tc.sample("n3", 80*time.Hour)
	require.Equal(t, 5*time.Millisecond, tc.off())
}

func TestClockLowerMedian(t *testing.T) {
	require.Equal(t, time.Duration(0), lowerMedian([]time.Duration{0}))
	require.Equal(t, -time.Hour, lowerMedian([]time.Duration{0, -time.Hour}))
	require.Equal(t, time.Duration(0), lowerMedian([]time.Duration{0, time.Hour}))
	require.Equal(t, time.Duration(0), lowerMedian([]time.Duration{2 * time.Hour, 0, time.Hour, -time.Hour}))
	require.Equal(t, time.Hour, lowerMedian([]time.Duration{2 * time.Hour, 0, time.Hour, -time.Hour, 3 * time.Hour}))

	// Four voters split evenly: the earlier of the two middle times.
	tc := newTestClusterClock(t, "n2", "n3", "n4")
	tc.sample("n2", time.Hour)
	tc.sample("n3", 2*time.Hour)
	tc.sample("n4", 3*time.Hour)
	require.Equal(t, time.Hour, tc.off())
}

func TestClockSingleVoter(t *testing.T) {
	tc := newTestClusterClock(t)
	tc.leader.Store(true)
	require.Equal(t, tc.machine.Now(), tc.Now())
	_, _, agreed := tc.skews()
	require.True(t, agreed)
}

// TestClockMajority: without fresh samples of a majority the leader
// keeps the last offset agreed (after its short wait); samples older than
// clockFresh do not count.
func TestClockMajority(t *testing.T) {
	tc := newTestClusterClock(t, "n2", "n3", "n4", "n5")
	tc.wait = 10 * time.Millisecond
	tc.leader.Store(true)
	tc.sample("n2", time.Hour)
	require.Zero(t, tc.off(), "two of five: no majority, no offset agreed yet")
	tc.sample("n3", time.Hour)
	require.Equal(t, time.Hour, tc.off(), "three of five")

	tc.advance(clockFresh)
	tc.sample("n4", 3*time.Hour)
	tc.sample("n5", 3*time.Hour)
	require.Equal(t, 3*time.Hour, tc.off(), "n2 and n3 are stale: 0, 3h, 3h")
	tc.advance(clockFresh)
	tc.sample("n2", 0)
	require.Equal(t, 3*time.Hour, tc.off(), "one fresh sample: the last agreed offset stays")
	_, _, agreed := tc.skews()
	require.False(t, agreed)

	// A voter removed from the configuration stops counting.
	tc.setPeers([]string{"n2"}, true)
	require.Equal(t, 3*time.Hour, tc.Now().Sub(tc.machine.Now()), "never backwards")
	tc.advance(4 * time.Hour)
	tc.sample("n2", 0)
	require.Zero(t, tc.off(), "n1 and n2 agree")
}

func TestClockNeverBackwards(t *testing.T) {
	tc := newTestClusterClock(t, "n2", "n3")
	tc.leader.Store(true)
	tc.sample("n2", time.Minute)
	tc.sample("n3", time.Minute)
	first := tc.Now()
	require.Equal(t, time.Minute, first.Sub(tc.machine.Now()))

	// The others' clocks step back by 30 s: the time holds until it
	// passes what was handed out.
	tc.sample("n2", 30*time.Second)
	tc.sample("n3", 30*time.Second)
	require.Equal(t, first, tc.Now())
	tc.advance(40 * time.Second)
	require.Equal(t, 10*time.Second, tc.Now().Sub(first), "40 s later, 30 s less ahead")

	// An applied stamp ahead (another leader's) is a floor too.
	floor := tc.machine.Now().Add(time.Hour)
	tc.floor.Store(floor.UnixNano())
	require.True(t, tc.Now().Equal(floor))

	// A follower's reading is no floor: before it heard the others it
	// reads its own clock, and once it leads it stamps theirs.
	tc = newTestClusterClock(t, "n2", "n3")
	require.Zero(t, tc.off(), "a follower that heard nobody")
	tc.sample("n2", -80*time.Hour)
	tc.leader.Store(true)
	require.Equal(t, -80*time.Hour, tc.off())
}

// TestClockLeaderWaits: a new leader without a majority of samples
// waits for them before it hands out a time, and no longer than its
// bound; then it stamps the last agreed offset.
func TestClockLeaderWaits(t *testing.T) {
	tc := newTestClusterClock(t, "n2", "n3")
	tc.leader.Store(true)
	tc.setLeader(true)
	got := make(chan time.Time, 1)
	go func() { got <- tc.Now() }()
	select {
	case <-got:
		t.Fatal("the leader stamped before any sample")
	case <-time.After(100 * time.Millisecond):
	}
	tc.sample("n2", -80*time.Hour)
	select {
	case now := <-got:
		require.Equal(t, -80*time.Hour, now.Sub(tc.machine.Now()), "self and n2: the lower of the two")
	case <-time.After(5 * time.Second):
		t.Fatal("the leader still waits after a majority answered")
	}

	tc = newTestClusterClock(t, "n2", "n3")
	tc.record("n2", clockSample{}, errors.New("refused"))
	tc.wait = 200 * time.Millisecond
	tc.leader.Store(true)
	tc.setLeader(true)
	start := time.Now()
	require.Equal(t, tc.machine.Now(), tc.Now(), "never agreed: its own clock")
	require.GreaterOrEqual(t, time.Since(start), tc.wait)
	start = time.Now()
	tc.Now()
	require.Less(t, time.Since(start), tc.wait, "it waits once per term")

	// A follower never waits.
	tc.leader.Store(false)
	tc.setLeader(false)
	start = time.Now()
	tc.Now()
	require.Less(t, time.Since(start), tc.wait)
}

// TestClockSkewMetric: every voter's skew from the cluster's time.
func TestClockSkewMetric(t *testing.T) {
	tc := newTestClusterClock(t, "n2", "n3")
	tc.sample("n2", -80*time.Hour)
	tc.sample("n3", -80*time.Hour+time.Second)
	sk, offset, agreed := tc.skews()
	require.True(t, agreed)
	require.Equal(t, -80*time.Hour+time.Second, offset)
	require.Equal(t, map[string]time.Duration{"n1": 80*time.Hour - time.Second, "n2": -time.Second, "n3": 0}, sk)
}

// countingCaller answers check-backs: COMMIT for transactions named
// "commit-...", UNKNOWN for the others; it counts the calls by transaction.
type countingCaller struct {
	mu    sync.Mutex
	calls map[string]int
}

func (c *countingCaller) Check(_ context.Context, _ checkback.Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[req.TransactionId]++
	if strings.HasPrefix(req.TransactionId, "commit-") {
		return txmqv1.Resolution_RESOLUTION_COMMIT, nil
	}
	return txmqv1.Resolution_RESOLUTION_UNSPECIFIED, nil
}

func (c *countingCaller) Close() error { return nil }

func (c *countingCaller) called(tx string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[tx]
}

// TestClusterClockSkewedLeader: a node whose clock is 80 h ahead, or
// behind, is made the leader. The half messages the others stamped are
// neither expired nor all checked at once; those due get their check and
// are committed; what it stamps is within a second of the true time; the
// retention sweep drops nothing.
func TestClusterClockSkewedLeader(t *testing.T) {
	for _, skew := range []time.Duration{80 * time.Hour, -80 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) { testSkewedLeader(t, skew) })
	}
}

func testSkewedLeader(t *testing.T, skew time.Duration) {
	caller := &countingCaller{calls: map[string]int{}}
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.CheckBack.Caller = caller
		cfg.RetentionInterval = 100 * time.Millisecond
		if cfg.Raft.NodeID == "n3" {
			cfg.Now = func() time.Time { return time.Now().Add(skew) }
		}
	})
	// Transfers and writes are retried: on a loaded machine a transfer
	// times out, and an election may come between.
	lead := func(to string, done func(id string) bool) *testBroker {
		var l *testBroker
		txmqtest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
			l = c.Leader()
			if done(l.Node().ID()) {
				return nil
			}
			_, err := l.admin.TransferLeadership(ctxT(t), &txmqv1.TransferLeadershipRequest{NodeId: to})
			return fmt.Errorf("leader %s: %v", l.Node().ID(), err)
		})
		return l
	}
	half := func(tx string, after time.Duration) string {
		var id string
		txmqtest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
			r, err := c.Leader().producer.SendHalf(ctxT(t), &txmqv1.SendHalfRequest{
				Topic: "orders", ProducerGroup: "shop", TransactionId: tx, Body: []byte(tx), CheckAfter: durationpb.New(after)})
			if err == nil {
				id = r.MessageId
			}
			return err
		})
		return id
	}
	leader := lead("", func(id string) bool { return id != "n3" })
	ctx := ctxT(t)
	callback := "http://127.0.0.1:1/check"
	_, err := leader.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{
		Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", CallbackUrl: &callback}})
	require.NoError(t, err)
	sent, err := leader.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte("plain")})
	require.NoError(t, err)
	ids := map[string]string{}
	for i := range 10 {
		ids[fmt.Sprint("hold-", i)] = half(fmt.Sprint("hold-", i), 10*time.Minute)
	}
	ids["commit-old"] = half("commit-old", 3*time.Second)

	skewed := lead("n3", func(id string) bool { return id == "n3" })
	ids["commit-new"] = half("commit-new", time.Second)
	h := halfOf(t, c.Leader(), ids["commit-new"])
	require.WithinDuration(t, time.Now(), h.CreatedAt.AsTime(), time.Second, "the skewed leader stamps the cluster's time")
	at, ok := idTime(ids["commit-new"])
	require.True(t, ok)
	require.WithinDuration(t, time.Now(), at, time.Second, "and puts it in message IDs")

	txmqtest.CheckFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		for _, tx := range []string{"commit-old", "commit-new"} {
			if st := halfOf(t, c.Leader(), ids[tx]).State; st != txmqv1.HalfState_HALF_STATE_COMMITTED {
				return fmt.Errorf("%s is %s", tx, st)
			}
		}
		return nil
	})
	require.Positive(t, caller.called("commit-old"))
	require.Positive(t, caller.called("commit-new"))
	for i := range 10 {
		tx := fmt.Sprint("hold-", i)
		require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, halfOf(t, c.Leader(), ids[tx]).State, tx)
		require.Zero(t, caller.called(tx), "%s was checked before it was due", tx)
	}
	m, err := c.Leader().admin.GetMessage(ctxT(t), &txmqv1.GetMessageRequest{Topic: "orders", MessageId: sent.MessageId})
	require.NoError(t, err, "retention kept the fresh message")
	require.Equal(t, "plain", string(m.GetMessage().GetBody()))

	_, offset, agreed := skewed.clock.skews()
	require.True(t, agreed)
	require.InDelta(t, -skew.Seconds(), offset.Seconds(), 1)
	c.VerifyStores()
}

// TestClockNotAVoter: a node not (yet) in the configuration is no single
// voter: its own clock does not count.
func TestClockNotAVoter(t *testing.T) {
	tc := newTestClusterClock(t)
	tc.setPeers(nil, false)
	_, _, agreed := tc.skews()
	require.False(t, agreed)
	tc.setPeers([]string{"n2", "n3"}, false)
	tc.sample("n2", time.Hour)
	tc.sample("n3", time.Hour+time.Second)
	require.Equal(t, time.Hour, tc.off(), "the voters' lower median, without this node")
}
