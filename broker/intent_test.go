package broker

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
)

// Group config changes carry only the fields they set, and the state
// machine merges them: two operators changing different fields at once
// both see their change take effect.
func TestConcurrentGroupConfigChangesAllTakeEffect(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	const rounds = 20
	for i := range rounds {
		producerGroup, consumerGroup := "shop"+string(rune('a'+i)), "points"+string(rune('a'+i))
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		set := func(f func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				errs <- f()
			}()
		}
		set(func() error {
			_, err := tb.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{
				ProducerGroup: producerGroup, MaxChecks: proto.Uint32(7)}})
			return err
		})
		set(func() error {
			_, err := tb.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{
				ProducerGroup: producerGroup, CallbackUrl: proto.String("http://127.0.0.1:9/check")}})
			return err
		})
		set(func() error {
			_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
				ConsumerGroup: consumerGroup, MaxDeliveries: proto.Uint32(3)}})
			return err
		})
		set(func() error {
			_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
				ConsumerGroup: consumerGroup, AckDeadline: durationpb.New(time.Minute)}})
			return err
		})
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		requireConfigs(t, tb, producerGroup, consumerGroup)
	}
}

// requireConfigs checks that both changes to each group took effect.
func requireConfigs(t *testing.T, tb *testBroker, producerGroup, consumerGroup string) {
	t.Helper()
	ctx := ctxT(t)
	pc, err := tb.admin.GetProducerGroupConfig(ctx, &txmqv1.GetProducerGroupConfigRequest{ProducerGroup: producerGroup})
	require.NoError(t, err)
	require.Equal(t, uint32(7), pc.Config.GetMaxChecks(), "max_checks of %s lost", producerGroup)
	require.Equal(t, "http://127.0.0.1:9/check", pc.Config.GetCallbackUrl(), "callback of %s lost", producerGroup)
	cc, err := tb.admin.GetConsumerGroupConfig(ctx, &txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: consumerGroup})
	require.NoError(t, err)
	require.Equal(t, uint32(3), cc.Config.GetMaxDeliveries(), "max_deliveries of %s lost", consumerGroup)
	require.Equal(t, time.Minute, cc.Config.GetAckDeadline().AsDuration(), "ack deadline of %s lost", consumerGroup)
}

// gate blocks a node's state machine, once armed, after the batch it is
// applying: the node's log keeps up while its store falls behind.
type gate struct {
	mu     sync.Mutex
	armed  bool
	closed chan struct{}
	// held is closed once the state machine is blocked.
	held        chan struct{}
	once        sync.Once
	releaseOnce sync.Once
}

func newGate() *gate { return &gate{closed: make(chan struct{}), held: make(chan struct{})} }

func (g *gate) hooks() raftlog.Hooks {
	return raftlog.Hooks{Applied: func(int, time.Duration) {
		g.mu.Lock()
		armed := g.armed
		g.mu.Unlock()
		if armed {
			g.once.Do(func() { close(g.held) })
			<-g.closed
		}
	}}
}

func (g *gate) release() { g.releaseOnce.Do(func() { close(g.closed) }) }

func (g *gate) arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

// A node that just became leader may not have applied everything that was
// committed: a config change served there must not write back the stale
// values it would read from its store. One group's config is changed there
// while the store lags (the leader has one entry of its own in flight, so
// the other group's change waits for the store), the other's after.
func TestClusterConfigThroughALaggingLeaderKeepsNewerChanges(t *testing.T) {
	for _, lagging := range []string{"producer group", "consumer group"} {
		t.Run(lagging, func(t *testing.T) { configThroughALaggingLeader(t, lagging == "producer group") })
	}
}

func configThroughALaggingLeader(t *testing.T, producerGroupFirst bool) {
	g := newGate()
	c := newCluster(t, 3, func(cfg *Config) {
		if cfg.Raft.NodeID == "n3" {
			cfg.Raft.Hooks = g.hooks()
		}
	})
	// Let n3's state machine go before the cluster stops, even if the
	// test fails first.
	t.Cleanup(g.release)
	leader := c.Leader()
	require.NotEqual(t, "n3", leader.Node().ID(), "n1 bootstraps and leads")
	ctx := ctxT(t)

	// Hold n3's state machine, then change one field of each group.
	g.arm()
	_, err := leader.producer.Send(ctx, &txmqv1.SendRequest{Topic: "wake", Body: []byte("x")})
	require.NoError(t, err)
	<-g.held
	_, err = leader.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{
		ProducerGroup: "shop", MaxChecks: proto.Uint32(7)}})
	require.NoError(t, err)
	_, err = leader.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: "points", MaxDeliveries: proto.Uint32(3)}})
	require.NoError(t, err)

	// n3 has both in its log but not in its store; it becomes leader.
	n3, _ := c.Node("n3")
	var logged uint64
	txmqtest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		want, err := leader.Node().Status()
		if err != nil {
			return err
		}
		got, err := n3.Node().Status()
		if err != nil {
			return err
		}
		if got.LastLogIndex != want.LastLogIndex {
			return fmt.Errorf("n3's log ends at %d, the leader's at %d", got.LastLogIndex, want.LastLogIndex)
		}
		logged = got.LastLogIndex
		return nil
	})
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		// A transfer that timed out may still have happened.
		if n3.Node().IsLeader() {
			return nil
		}
		return leader.Node().TransferLeadership("n3")
	})
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !n3.Node().IsLeader() {
			return fmt.Errorf("n3 is not the leader yet")
		}
		return nil
	})

	// Change one group's other field through n3 while its store still
	// lags: it waits for n3's state machine, which resumes once it is in
	// n3's log (after the new leader's no-op). Then the other's.
	setProducer := func() error {
		_, err := n3.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{
			ProducerGroup: "shop", CallbackUrl: proto.String("http://127.0.0.1:9/check")}})
		return err
	}
	setConsumer := func() error {
		_, err := n3.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
			ConsumerGroup: "points", AckDeadline: durationpb.New(time.Minute)}})
		return err
	}
	first, second := setProducer, setConsumer
	if !producerGroupFirst {
		first, second = setConsumer, setProducer
	}
	done := make(chan error, 1)
	go func() { done <- first() }()
	txmqtest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		st, err := n3.Node().Status()
		if err != nil {
			return err
		}
		if st.LastLogIndex < logged+2 {
			return fmt.Errorf("n3's log ends at %d, not yet at %d", st.LastLogIndex, logged+2)
		}
		return nil
	})
	g.release()
	require.NoError(t, <-done)
	require.NoError(t, second())
	requireConfigs(t, n3, "shop", "points")
	c.VerifyStores()
}

// A subscriber that reconnects to a group that exists writes nothing to
// the Raft log (it used to propose CreateTopic and CreateGroup each time).
func TestResubscribeWritesNothing(t *testing.T) {
	tb := startBroker(t, nil)
	// The node announces its own address once, a little after start.
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if !tb.recorded() {
			return fmt.Errorf("address not recorded yet")
		}
		return nil
	})
	sub := subscribe(t, tb, "orders", "points", 0)
	require.NoError(t, sub.stream.CloseSend())
	before, err := tb.Node().Status()
	require.NoError(t, err)
	applied := tb.Node().AppliedByFSM()
	again := subscribe(t, tb, "orders", "points", 0)
	require.Nil(t, again.next(100*time.Millisecond))
	after, err := tb.Node().Status()
	require.NoError(t, err)
	require.Equal(t, before.LastLogIndex, after.LastLogIndex, "log entries written by a resubscription")
	require.Equal(t, applied, tb.Node().AppliedByFSM())
}

// DedupWindow Disabled turns dedup off: a repeated key is a new message
// (zero would mean the default window).
func TestDedupDisabled(t *testing.T) {
	tb := startBroker(t, func(cfg *Config) { cfg.DedupWindow = Disabled })
	ctx := ctxT(t)
	a, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Key: "k", Body: []byte("1")})
	require.NoError(t, err)
	b, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Key: "k", Body: []byte("2")})
	require.NoError(t, err)
	require.False(t, b.Duplicate)
	require.NotEqual(t, a.MessageId, b.MessageId)

	// Refused before anything listens.
	_, err = Open(Config{Raft: raftlog.Config{NodeID: "n1", Dir: t.TempDir()}, DedupWindow: -2 * time.Second})
	require.ErrorContains(t, err, "dedup window -2s is negative")
}
