package main

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// nodeScrape is a scrape with one log store histogram (bounds 1, 2, 4 ms) and
// the node's Raft state.
func nodeScrape(t *testing.T, state string, count, sum float64, cum ...float64) scrape {
	t.Helper()
	text := fmt.Sprintf(`# TYPE txmq_raft_state gauge
txmq_raft_state{state=%q} 1
# TYPE txmq_raft_log_store_duration_seconds histogram
txmq_raft_log_store_duration_seconds_bucket{le="0.001"} %g
txmq_raft_log_store_duration_seconds_bucket{le="0.002"} %g
txmq_raft_log_store_duration_seconds_bucket{le="0.004"} %g
txmq_raft_log_store_duration_seconds_bucket{le="+Inf"} %g
txmq_raft_log_store_duration_seconds_sum %g
txmq_raft_log_store_duration_seconds_count %g
`, state, cum[0], cum[1], cum[2], count, sum, count)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// The breakdown takes what each histogram gained over the window, the
// leader's alone and the followers' together, with the mean from the sums
// and the p50 and p99 interpolated in their samples' buckets.
func TestBreakdownOfTwoScrapes(t *testing.T) {
	before := []scrape{
		nodeScrape(t, "FOLLOWER", 10, 0.010, 10, 10, 10),
		nodeScrape(t, "LEADER", 5, 0.005, 5, 5, 5),
		nodeScrape(t, "FOLLOWER", 0, 0, 0, 0, 0),
	}
	after := []scrape{
		// +10 in (1, 2] ms, 15 ms in all.
		nodeScrape(t, "FOLLOWER", 20, 0.025, 10, 20, 20),
		// +4: 1 in (0, 1], 2 in (1, 2], 1 in (2, 4] ms, 6 ms in all.
		nodeScrape(t, "LEADER", 9, 0.011, 6, 8, 9),
		// +10 in (2, 4] ms, 30 ms in all.
		nodeScrape(t, "FOLLOWER", 10, 0.030, 0, 0, 10),
	}
	bd := newBreakdown(before, after, false)
	if bd.leader != "n2" || len(bd.notes) != 0 {
		t.Fatalf("leader %q, notes %v", bd.leader, bd.notes)
	}
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9 {
			t.Errorf("%s: %g, want %g", what, got, want)
		}
	}
	leader, ok := bd.row("leader_log_store")
	if !ok {
		t.Fatal("no leader row")
	}
	near("leader count", leader.count, 4)
	near("leader mean", leader.mean(), 0.0015)
	// Rank 2 of 4: one below 1 ms, so halfway through the two in (1, 2].
	near("leader p50", leader.quantile(0.5), 0.0015)
	// Rank 3.96 of 4: 0.96 of the way through the one in (2, 4].
	near("leader p99", leader.quantile(0.99), 0.00392)
	followers, ok := bd.row("follower_log_store")
	if !ok {
		t.Fatal("no followers row")
	}
	near("followers count", followers.count, 20)
	near("followers mean", followers.mean(), 0.00225)
	// Rank 10 of 20: the last of the ten in (1, 2] ms.
	near("followers p50", followers.quantile(0.5), 0.002)
	// Rank 19.8 of 20: 9.8 of the ten in (2, 4] ms.
	near("followers p99", followers.quantile(0.99), 0.00396)
	if _, ok := bd.row("follower_apply"); ok {
		t.Error("a stage without samples has a row")
	}

	// A leader that changed during the window is said so.
	before[0] = nodeScrape(t, "LEADER", 10, 0.010, 10, 10, 10)
	before[1] = nodeScrape(t, "FOLLOWER", 5, 0.005, 5, 5, 5)
	if bd := newBreakdown(before, after, false); len(bd.notes) != 1 || bd.leader != "n2" {
		t.Errorf("leader %q, notes %v, want n2 and the leader change", bd.leader, bd.notes)
	}
}

// A quantile whose sample lies beyond the last finite bound is that bound:
// the histogram says no more.
func TestQuantileBeyondTheBuckets(t *testing.T) {
	h := histogram{count: 4, bounds: []float64{0.001, 0.002}, cum: []float64{2, 3}}
	if got := h.quantile(0.99); got != 0.002 {
		t.Errorf("p99 %g, want the last bound 0.002", got)
	}
	if got := h.quantile(0.5); got != 0.001 {
		t.Errorf("p50 %g, want 0.001 (the second of four, the last in the first bucket)", got)
	}
}

// A stage counts the samples sure to be over 5 ms, those beyond the first
// bucket bound at or above it, in the table and in the JSON; with no such
// bound it says nothing.
func TestSlowCounts(t *testing.T) {
	// 5 up to 1 ms, 2 in (1, 5.2], 2 in (5.2, 7.8], 1 beyond.
	h := histogram{count: 10, sum: 0.03, bounds: []float64{0.001, 0.0052, 0.0078}, cum: []float64{5, 7, 9}}
	if got := h.over(0.005); got != 3 {
		t.Errorf("over 5 ms: %g, want 3 (beyond 5.2 ms)", got)
	}
	if got := h.over(0.006); got != 1 {
		t.Errorf("over 6 ms: %g, want 1 (beyond 7.8 ms)", got)
	}
	if got := h.over(0.01); !math.IsNaN(got) {
		t.Errorf("over 10 ms: %g, want NaN (no bound reaches it)", got)
	}

	var def stageDef
	for _, d := range stageDefs {
		if d.key == "entry_write" {
			def = d
		}
	}
	short := histogram{count: 4, sum: 0.004, bounds: []float64{0.001, 0.002}, cum: []float64{2, 4}}
	bd := &breakdown{leader: "n1", rows: []stageRow{{def: def, h: h}, {def: stageDefs[0], h: short}}}
	r := &result{Workload: "e2e"}
	o := map[string]any{}
	bd.fields(r, o)
	if o["stage_entry_write_over_5ms"] != 3.0 {
		t.Errorf("JSON stage_entry_write_over_5ms = %v, want 3", o["stage_entry_write_over_5ms"])
	}
	if _, ok := o["stage_"+stageDefs[0].key+"_over_5ms"]; ok {
		t.Errorf("a stage whose buckets end before 5 ms has an over_5ms: %v", o)
	}
	var b strings.Builder
	bd.write(&b, r)
	var row, shortRow string
	for _, l := range strings.Split(b.String(), "\n") {
		switch {
		case strings.Contains(l, def.what):
			row = l
		case strings.Contains(l, stageDefs[0].what):
			shortRow = l
		}
	}
	if f := strings.Fields(row); len(f) == 0 || f[len(f)-1] != "3" || f[len(f)-5] != "10" {
		t.Errorf("the quorum write's row does not end with its count of 10 ... and 3 over 5 ms: %q", row)
	}
	if f := strings.Fields(shortRow); len(f) == 0 || f[len(f)-1] != "1.980" {
		t.Errorf("a row with no count over 5 ms should end with its p99 (1.980): %q", shortRow)
	}
}
