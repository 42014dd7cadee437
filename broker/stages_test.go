package broker

import (
	"fmt"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// delta is what a histogram (count and sum) or counter gained between two
// scrapes.
func delta(before, after map[string]*dto.MetricFamily, name string, labels ...string) (count, sum float64) {
	c0, _ := sample(before, name, labels...)
	c1, ok := sample(after, name, labels...)
	if !ok {
		return 0, 0
	}
	s0, s1 := histSum(before, name, labels...), histSum(after, name, labels...)
	if s0 < 0 {
		s0 = 0
	}
	return c1 - c0, s1 - s0
}

// sendConcurrently makes n plain Sends from 16 goroutines, so that the
// batcher merges some of them.
func sendConcurrently(t *testing.T, tb *testBroker, topic string, n int) {
	t.Helper()
	ctx := ctxT(t)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < n; i += 16 {
				_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: topic, Body: fmt.Appendf(nil, "m%d", i)})
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// N concurrent sends on one node: the batcher's histograms count every
// proposal once, the entries they were merged into add up to N, every
// entry handed to raft.Apply was applied, and raft's own commit timing saw
// at least those entries. Read from a real scrape.
func TestStageMetricsCountProposals(t *testing.T) {
	tb := startBroker(t, func(cfg *Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	_, err := tb.producer.Send(ctxT(t), &txmqv1.SendRequest{Topic: "orders", Body: []byte("first")})
	require.NoError(t, err, "creates the topic before the measured sends")

	const n = 96
	// The node announces its address through Raft once it leads: wait
	// until that and every other entry it proposed was answered.
	var before map[string]*dto.MetricFamily
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if !tb.recorded() {
			return errNotYet("not announced yet")
		}
		before = scrape(t, tb)
		proposed, _ := sample(before, "txmq_raft_entry_proposals")
		written, _ := sample(before, "txmq_raft_entry_write_duration_seconds")
		if proposed != written {
			return errNotYet(fmt.Sprintf("%v entries proposed, %v written", proposed, written))
		}
		return nil
	})
	sendConcurrently(t, tb, "orders", n)
	after := scrape(t, tb)

	waits, waitSum := delta(before, after, "txmq_raft_proposal_wait_duration_seconds")
	require.Equal(t, float64(n), waits, "one wait per proposal")
	require.Positive(t, waitSum)
	entries, proposals := delta(before, after, "txmq_raft_entry_proposals")
	require.Equal(t, float64(n), proposals, "the entries carry every proposal once")
	require.GreaterOrEqual(t, entries, 1.0)
	require.LessOrEqual(t, entries, float64(n))
	written, _ := delta(before, after, "txmq_raft_entry_write_duration_seconds")
	require.Equal(t, entries, written, "every entry handed to raft.Apply was applied")
	calls, _ := delta(before, after, "txmq_grpc_request_duration_seconds", "method", "/txmq.v1.ProducerService/Send")
	require.Equal(t, float64(n), calls)
	commits, _ := delta(before, after, "txmq_raft_stage_duration_seconds", "stage", "raft.commitTime")
	require.GreaterOrEqual(t, commits, entries, "raft timed the commit of every entry")
	dispatches, _ := delta(before, after, "txmq_raft_stage_duration_seconds", "stage", "raft.leader.dispatchLog")
	require.Positive(t, dispatches)
	_, unwanted := sample(after, "txmq_raft_stage_duration_seconds", "stage", "raft.fsm.applyBatchNum")
	require.False(t, unwanted, "only the listed timers are kept")
}

// On three nodes the go-metrics sink sees the replication stages, the
// followers' handling of AppendEntries (not heartbeats) and their log
// appends, and the batcher's histograms stay on the leader.
func TestClusterRaftStages(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	leader, follower := c.Leader(), c.Follower()
	const n = 32
	lb, fb := scrape(t, leader), scrape(t, follower)
	sendConcurrently(t, leader, "orders", n)
	want, err := leader.Node().Store().AppliedIndex()
	require.NoError(t, err)
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if got, err := follower.Node().Store().AppliedIndex(); err != nil || got < want {
			return errNotYet(fmt.Sprintf("follower applied %d of %d (%v)", got, want, err))
		}
		return nil
	})
	la, fa := scrape(t, leader), scrape(t, follower)

	waits, _ := delta(lb, la, "txmq_raft_proposal_wait_duration_seconds")
	require.GreaterOrEqual(t, waits, float64(n))
	followerWaits, _ := delta(fb, fa, "txmq_raft_proposal_wait_duration_seconds")
	require.Zero(t, followerWaits, "a follower proposes nothing")
	stored, _ := delta(fb, fa, "txmq_raft_log_store_duration_seconds")
	require.Positive(t, stored, "the follower appended the entries")
	for _, stage := range []string{"raft.replication.appendEntries.rpc", "raft.rpc.appendEntries", "raft.rpc.appendEntries.storeLogs",
		"raft.net.rpcDecode", "raft.net.rpcEnqueue", "raft.commitTime", "raft.fsm.applyBatch"} {
		got, _ := delta(lb, la, "txmq_raft_stage_duration_seconds", "stage", stage)
		require.Positive(t, got, stage)
	}
	c.VerifyStores()
}
