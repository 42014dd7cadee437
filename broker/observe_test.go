package broker

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/internal/buildinfo"
	"github.com/txmq/txmq/internal/syncbuf"
	"github.com/txmq/txmq/internal/txmqtest"
)

// scriptedCaller answers check-backs from a script per transaction ID: each
// check takes the next answer, and the last one repeats.
type scriptedCaller struct {
	mu      sync.Mutex
	answers map[string][]txmqv1.Resolution
}

func (c *scriptedCaller) Check(_ context.Context, _ checkback.Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.answers[req.TransactionId]
	if len(q) == 0 {
		return txmqv1.Resolution_RESOLUTION_UNSPECIFIED, nil
	}
	if len(q) > 1 {
		c.answers[req.TransactionId] = q[1:]
	}
	return q[0], nil
}

func (c *scriptedCaller) Close() error { return nil }

// scrape reads /metrics and parses it.
func scrape(t *testing.T, tb *testBroker) map[string]*dto.MetricFamily {
	t.Helper()
	_, body := get(t, "http://"+tb.MetricsAddr()+"/metrics")
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)
	return fams
}

// sample finds the value of a counter or gauge, or the count of a
// histogram, with exactly these labels (name=value pairs); ok is false
// when there is no such series.
func sample(fams map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		match := true
		for _, l := range m.Label {
			if want[l.GetName()] != l.GetValue() {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func histSum(fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		match := len(got) == len(labels)/2
		for i := 0; i+1 < len(labels); i += 2 {
			match = match && got[labels[i]] == labels[i+1]
		}
		if match && m.Histogram != nil {
			return m.Histogram.GetSampleSum()
		}
	}
	return -1
}

// A known mix of producer, check-back, operator and expiry resolutions,
// plain sends, acks, a redelivery and a dead letter, read back from a real
// scrape of /metrics. The clock stands still, so nothing happens that the
// test does not drive.
func TestMetricsEndToEnd(t *testing.T) {
	clk := newClock()
	caller := &scriptedCaller{answers: map[string][]txmqv1.Resolution{
		"c1":  {txmqv1.Resolution_RESOLUTION_UNSPECIFIED, txmqv1.Resolution_RESOLUTION_COMMIT},
		"c2":  {txmqv1.Resolution_RESOLUTION_ROLLBACK},
		"x1":  {txmqv1.Resolution_RESOLUTION_UNSPECIFIED},
		"x2":  {txmqv1.Resolution_RESOLUTION_UNSPECIFIED},
		"sub": {txmqv1.Resolution_RESOLUTION_UNSPECIFIED},
	}}
	tb := startBroker(t, func(cfg *Config) {
		cfg.Now = clk.Now
		cfg.MetricsAddr = "127.0.0.1:0"
		cfg.CheckBack.Caller = caller
	})
	ctx := ctxT(t)
	callback := "http://127.0.0.1:1/check"
	one := uint32(1)
	for _, pg := range []*txmqv1.ProducerGroupConfig{
		{ProducerGroup: "shop", CallbackUrl: &callback},
		{ProducerGroup: "legacy", CallbackUrl: &callback, MaxChecks: &one},
	} {
		_, err := tb.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: pg})
		require.NoError(t, err)
	}
	_, err := tb.producer.RegisterProducer(ctx, &txmqv1.RegisterProducerRequest{ProducerGroup: "shop", InstanceId: "shop-1",
		Endpoint: &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "127.0.0.1:1"}}})
	require.NoError(t, err)
	two := uint32(2)
	_, err = tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: "points", MaxDeliveries: &two, RedeliveryBackoff: []*durationpb.Duration{durationpb.New(0)},
	}})
	require.NoError(t, err)

	ids := map[string]string{}
	for _, tx := range []string{"p1", "p2", "p3", "p4", "c1", "c2", "o1", "pending"} {
		ids[tx] = sendHalf(t, tb, "orders", "shop", tx, tx)
	}
	ids["x1"] = sendHalf(t, tb, "orders", "legacy", "x1", "x1")
	ids["x2"] = sendHalf(t, tb, "orders", "legacy", "x2", "x2")
	for _, tx := range []string{"p1", "p2", "p3"} {
		_, err := end(tb, ctx, ids[tx], txmqv1.Resolution_RESOLUTION_COMMIT)
		require.NoError(t, err)
	}
	_, err = end(tb, ctx, ids["p1"], txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err, "a repeated commit succeeds and counts once")
	_, err = end(tb, ctx, ids["p4"], txmqv1.Resolution_RESOLUTION_ROLLBACK)
	require.NoError(t, err)
	check := func(tx string) *txmqv1.CheckHalfMessageResponse {
		r, err := tb.admin.CheckHalfMessage(ctx, &txmqv1.CheckHalfMessageRequest{MessageId: ids[tx]})
		require.NoError(t, err)
		return r
	}
	check("c1") // UNKNOWN: one attempt used
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, check("c1").Message.State)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_ROLLED_BACK, check("c2").Message.State)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_EXPIRED, check("x1").Message.State, "max_checks 1 used up")
	require.Equal(t, txmqv1.HalfState_HALF_STATE_EXPIRED, check("x2").Message.State, "stays parked")
	for tx, res := range map[string]txmqv1.Resolution{"o1": txmqv1.Resolution_RESOLUTION_ROLLBACK, "x1": txmqv1.Resolution_RESOLUTION_COMMIT} {
		_, err := tb.admin.ResolveHalfMessage(ctx, &txmqv1.ResolveHalfMessageRequest{MessageId: ids[tx], Resolution: res})
		require.NoError(t, err)
	}
	for i := 0; i < 2; i++ {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte("plain")})
		require.NoError(t, err)
	}
	// Committed: p1 p2 p3 c1 x1 and the two plain sends.
	const committed = 7

	sub := subscribe(t, tb, "orders", "points", 0)
	var got []*txmqv1.Delivery
	for len(got) < committed {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d, "after %d deliveries", len(got))
		got = append(got, d)
	}
	poison, flaky := got[0].MessageId, got[1].MessageId
	var acks []string
	for _, d := range got[2:] {
		acks = append(acks, d.MessageId)
	}
	sub.ack(acks...)
	sub.waitConfirm(acks...)
	sub.nack(nil, "boom", poison, flaky)
	for seen := map[string]bool{}; len(seen) < 2; {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d, "redeliveries")
		require.Equal(t, uint32(2), d.Attempt)
		seen[d.MessageId] = true
	}
	sub.nack(nil, "boom again", poison)
	sub.ack(flaky)
	sub.waitConfirm(flaky)
	_, err = tb.admin.TakeSnapshot(ctx, &txmqv1.TakeSnapshotRequest{})
	require.NoError(t, err)

	var fams map[string]*dto.MetricFamily
	txmqtest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		fams = scrape(t, tb)
		if v, _ := sample(fams, "txmq_messages_dead_lettered_total", "topic", "orders", "group", "points"); v != 1 {
			return errNotYet("dead letter not recorded yet")
		}
		return nil
	})
	og := []string{"topic", "orders", "group", "points"}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"txmq_half_messages_resolved_total", []string{"group", "shop", "state", "committed", "source", "producer"}, 3},
		{"txmq_half_messages_resolved_total", []string{"group", "shop", "state", "rolled_back", "source", "producer"}, 1},
		{"txmq_half_messages_resolved_total", []string{"group", "shop", "state", "committed", "source", "checkback"}, 1},
		{"txmq_half_messages_resolved_total", []string{"group", "shop", "state", "rolled_back", "source", "checkback"}, 1},
		{"txmq_half_messages_resolved_total", []string{"group", "shop", "state", "rolled_back", "source", "operator"}, 1},
		{"txmq_half_messages_resolved_total", []string{"group", "legacy", "state", "expired", "source", "expiry"}, 2},
		{"txmq_half_messages_resolved_total", []string{"group", "legacy", "state", "committed", "source", "operator"}, 1},
		{"txmq_half_resolution_seconds", []string{"group", "shop", "source", "producer"}, 4},
		{"txmq_half_resolution_seconds", []string{"group", "shop", "source", "checkback"}, 2},
		{"txmq_half_resolution_seconds", []string{"group", "shop", "source", "operator"}, 1},
		{"txmq_half_resolution_seconds", []string{"group", "legacy", "source", "expiry"}, 2},
		{"txmq_half_check_attempts_at_resolution", []string{"group", "shop"}, 7},
		{"txmq_half_check_attempts_at_resolution", []string{"group", "legacy"}, 3},
		{"txmq_checkback_calls_total", []string{"group", "shop", "result", "unknown"}, 1},
		{"txmq_checkback_calls_total", []string{"group", "shop", "result", "commit"}, 1},
		{"txmq_checkback_calls_total", []string{"group", "shop", "result", "rollback"}, 1},
		{"txmq_checkback_calls_total", []string{"group", "legacy", "result", "unknown"}, 2},
		{"txmq_checkback_call_duration_seconds", []string{"group", "shop"}, 3},
		{"txmq_half_messages_pending", []string{"group", "shop"}, 1},
		{"txmq_half_messages_pending_by_age", []string{"group", "shop", "older_than", "6s"}, 0},
		{"txmq_half_messages_expired", []string{"group", "legacy"}, 1},
		{"txmq_half_oldest_pending_age_seconds", []string{"group", "shop"}, 0},
		{"txmq_checkback_static_callback", []string{"group", "shop"}, 1},
		{"txmq_messages_committed_total", []string{"topic", "orders"}, committed},
		{"txmq_messages_delivered_total", og, committed + 2},
		{"txmq_messages_redelivered_total", og, 2},
		{"txmq_messages_acked_total", og, committed - 1},
		{"txmq_messages_dead_lettered_total", og, 1},
		{"txmq_message_commit_to_first_delivery_seconds", og, committed},
		{"txmq_message_first_delivery_to_ack_seconds", og, committed - 1},
		{"txmq_message_commit_to_ack_seconds", og, committed - 1},
		{"txmq_group_lag_messages", og, 0},
		{"txmq_group_dead_letters", og, 1},
		{"txmq_group_in_flight", og, 0},
		{"txmq_group_subscribers", og, 1},
		{"txmq_raft_snapshot_duration_seconds", nil, 1},
	} {
		v, ok := sample(fams, c.name, c.labels...)
		require.True(t, ok, "%s%v missing", c.name, c.labels)
		require.Equal(t, c.want, v, "%s%v", c.name, c.labels)
	}
	// A check-back that resolves counts as an attempt: c1's UNKNOWN and
	// COMMIT, c2's ROLLBACK. x1 used its one check and kept the count
	// through the operator's commit; x2 used its one.
	require.Equal(t, 3.0, histSum(fams, "txmq_half_check_attempts_at_resolution", "group", "shop"))
	require.Equal(t, 3.0, histSum(fams, "txmq_half_check_attempts_at_resolution", "group", "legacy"))
	_, ok := sample(fams, "txmq_half_messages_expired", "group", "shop")
	require.False(t, ok, "no series for a group without expired messages")
	_, ok = sample(fams, "txmq_half_oldest_pending_age_seconds", "group", "legacy")
	require.False(t, ok, "no series for a group without pending messages")
	info := buildinfo.Get()
	v, ok := sample(fams, "txmq_build_info", "version", info.Version, "revision", info.Revision, "go_version", info.GoVersion)
	require.True(t, ok && v == 1, "txmq_build_info")
	// The clock stood still: every latency is 0.
	require.Equal(t, 0.0, histSum(fams, "txmq_message_commit_to_ack_seconds", og...))
	applied, _ := sample(fams, "txmq_raft_applied_entries_total")
	batches, _ := sample(fams, "txmq_raft_apply_batch_entries")
	require.Equal(t, applied, histSum(fams, "txmq_raft_apply_batch_entries"), "the batch sizes add up to the entries applied")
	require.Positive(t, batches)
	for _, name := range []string{"txmq_raft_apply_duration_seconds", "txmq_raft_log_store_duration_seconds", "txmq_checkback_scan_duration_seconds"} {
		n, ok := sample(fams, name)
		require.True(t, ok, name)
		require.Positive(t, n, name)
	}

	// Every metric the alerts and the dashboard use is in this scrape.
	for _, name := range docNames(t, exportedNames(t)) {
		require.Contains(t, fams, name, "docs use %s; the scrape has no such series", name)
	}

	// brokerctl stats reads the same figures through GetStats.
	st, err := tb.admin.GetStats(ctx, &txmqv1.GetStatsRequest{})
	require.NoError(t, err)
	require.Equal(t, "n1", st.NodeId)
	require.True(t, clk.Now().Equal(st.TakenAt.AsTime()))
	require.Len(t, st.Topics, 1)
	require.Equal(t, uint64(committed), st.Topics[0].Committed)
	require.Len(t, st.ProducerGroups, 2)
	legacy, shop := st.ProducerGroups[0], st.ProducerGroups[1]
	require.Equal(t, "shop", shop.ProducerGroup)
	require.Equal(t, uint64(1), shop.Pending)
	require.NotNil(t, shop.OldestPendingAge)
	require.Equal(t, uint64(4), shop.CommittedTotal)
	require.Equal(t, uint64(3), shop.RolledBackTotal)
	require.Equal(t, uint64(3), shop.ChecksTotal)
	require.Zero(t, shop.CheckErrorsTotal)
	require.Equal(t, "legacy", legacy.ProducerGroup)
	require.Zero(t, legacy.Pending)
	require.Nil(t, legacy.OldestPendingAge)
	require.Equal(t, uint64(1), legacy.Expired, "x2; the operator committed x1")
	require.Equal(t, uint64(2), legacy.ExpiredTotal)
	require.Equal(t, uint64(1), legacy.CommittedTotal)
	require.Len(t, st.ConsumerGroups, 1)
	cg := st.ConsumerGroups[0]
	require.Equal(t, "points", cg.ConsumerGroup)
	require.Zero(t, cg.Lag)
	require.Nil(t, cg.LagAge)
	require.Equal(t, uint64(1), cg.DeadLetters)
	require.Equal(t, uint32(1), cg.Subscribers)
	require.Equal(t, uint64(committed+2), cg.DeliveredTotal)
	require.Equal(t, uint64(2), cg.RedeliveredTotal)
	require.Equal(t, uint64(committed-1), cg.AckedTotal)
	require.Equal(t, uint64(1), cg.DeadLetteredTotal)
}

// linesOf returns the log records in logs that carry msg_id id, in order.
func linesOf(t *testing.T, logs *syncbuf.Buffer, id string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), sc.Text())
		if rec["msg_id"] == id {
			out = append(out, rec)
		}
	}
	return out
}

// One grep by message ID tells the message's whole story, at Info level:
// stored as a half message, checked back and committed, delivered, nacked,
// delivered again, acked.
func TestLogsFollowOneMessage(t *testing.T) {
	logs := &syncbuf.Buffer{}
	caller := &scriptedCaller{answers: map[string][]txmqv1.Resolution{"order-7:paid": {txmqv1.Resolution_RESOLUTION_COMMIT}}}
	tb := startBroker(t, func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		cfg.CheckBack.Caller = caller
	})
	ctx := ctxT(t)
	callback := "http://127.0.0.1:1/check"
	_, err := tb.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{
		ProducerGroup: "shop", CallbackUrl: &callback,
	}})
	require.NoError(t, err)
	id := sendHalf(t, tb, "orders", "shop", "order-7:paid", "7 points")
	_, err = tb.admin.CheckHalfMessage(ctx, &txmqv1.CheckHalfMessageRequest{MessageId: id})
	require.NoError(t, err)

	sub := subscribe(t, tb, "orders", "points", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	zero := time.Duration(0)
	sub.nack(&zero, "points service down", id)
	d = sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, uint32(2), d.Attempt)
	sub.ack(id)
	sub.waitConfirm(id)

	var recs []map[string]any
	txmqtest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		recs = linesOf(t, logs, id)
		if len(recs) == 0 || recs[len(recs)-1]["msg"] != "acked" {
			return errNotYet("ack not logged yet")
		}
		return nil
	})
	var story []string
	for _, r := range recs {
		require.Equal(t, "INFO", r["level"], "%v", r)
		require.Equal(t, "orders", r["topic"], "%v", r)
		require.Equal(t, "order-7:paid", r["tx_id"], "%v", r)
		require.Equal(t, "shop", r["producer_group"], "%v", r)
		step, _ := r["msg"].(string)
		switch step {
		case "delivered", "delivery failed", "acked":
			require.Equal(t, "points", r["group"], "%v", r)
			step += fmt.Sprint(" ", r["attempt"])
		case "check-back resolved half message":
			step += " " + r["resolution"].(string)
		}
		story = append(story, step)
	}
	require.Equal(t, []string{
		"half message stored",
		"check-back resolved half message RESOLUTION_COMMIT",
		"delivered 1",
		"delivery failed 1",
		"delivered 2",
		"acked 2",
	}, story)
}
