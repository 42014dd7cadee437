package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// --breakdown: every node's /metrics is scraped when the measured window
// opens and when it closes; what the stage histograms gained in between is
// where the window's writes spent their time, on the leader and on the
// followers, printed beside the client's own latencies.

type scrape map[string]*dto.MetricFamily

// scrapeAll reads every node's /metrics.
func scrapeAll(addrs []string) ([]scrape, error) {
	client := http.Client{Timeout: 5 * time.Second}
	var out []scrape
	for i, a := range addrs {
		resp, err := client.Get("http://" + a + "/metrics")
		if err != nil {
			return nil, fmt.Errorf("--breakdown: scrape n%d: %w", i+1, err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := p.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("--breakdown: parse n%d's /metrics: %w", i+1, err)
		}
		out = append(out, fams)
	}
	return out, nil
}

// histogram is one histogram's counts, or what it gained over the window.
type histogram struct {
	count, sum float64
	bounds     []float64 // finite upper bounds
	cum        []float64 // cumulative counts at each bound
}

// find returns the histogram of name whose labels include these pairs.
func (s scrape) find(name string, labels []string) (histogram, bool) {
	f := s[name]
	if f == nil {
		return histogram{}, false
	}
	for _, m := range f.Metric {
		if m.Histogram == nil || !hasLabels(m, labels) {
			continue
		}
		h := histogram{count: float64(m.Histogram.GetSampleCount()), sum: m.Histogram.GetSampleSum()}
		for _, b := range m.Histogram.Bucket {
			if !math.IsInf(b.GetUpperBound(), 1) {
				h.bounds = append(h.bounds, b.GetUpperBound())
				h.cum = append(h.cum, float64(b.GetCumulativeCount()))
			}
		}
		return h, true
	}
	return histogram{}, false
}

func hasLabels(m *dto.Metric, pairs []string) bool {
	for i := 0; i+1 < len(pairs); i += 2 {
		found := false
		for _, l := range m.Label {
			found = found || (l.GetName() == pairs[i] && l.GetValue() == pairs[i+1])
		}
		if !found {
			return false
		}
	}
	return true
}

// gauge is the value of a gauge with these labels, 0 when absent.
func (s scrape) gauge(name string, labels ...string) float64 {
	if f := s[name]; f != nil {
		for _, m := range f.Metric {
			if m.Gauge != nil && hasLabels(m, labels) {
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

// minus is what h gained since before (a histogram that did not exist
// before gained all of it).
func (h histogram) minus(before histogram, existed bool) histogram {
	if !existed {
		return h
	}
	d := histogram{count: h.count - before.count, sum: h.sum - before.sum, bounds: h.bounds}
	for i := range h.cum {
		c := h.cum[i]
		if i < len(before.cum) {
			c -= before.cum[i]
		}
		d.cum = append(d.cum, c)
	}
	return d
}

// plus merges two nodes' histograms of the same layout.
func (h histogram) plus(o histogram) histogram {
	if h.bounds == nil {
		return o
	}
	out := histogram{count: h.count + o.count, sum: h.sum + o.sum, bounds: h.bounds}
	for i := range h.cum {
		c := h.cum[i]
		if i < len(o.cum) {
			c += o.cum[i]
		}
		out.cum = append(out.cum, c)
	}
	return out
}

func (h histogram) mean() float64 { return h.sum / h.count }

// quantile interpolates linearly within the bucket holding the q-th
// sample, as Prometheus' histogram_quantile does: within a bucket 1.5×
// wide (the raft stages') it is off by a third of the value at most. A
// rank beyond the last finite bound gives that bound.
func (h histogram) quantile(q float64) float64 {
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, upper := range h.bounds {
		if h.cum[i] >= rank {
			in := h.cum[i] - below
			if in == 0 {
				return upper
			}
			return lower + (upper-lower)*(rank-below)/in
		}
		lower, below = upper, h.cum[i]
	}
	return lower
}

// over is how many samples are sure to be above limit: those beyond the
// first bucket bound at or above it (so for the Raft stages' buckets, 1.5×
// apart, "over 5 ms" counts from 5.2 ms, and for the handlers', 2× apart,
// from 8 ms). NaN when no finite bound reaches limit.
func (h histogram) over(limit float64) float64 {
	for i, upper := range h.bounds {
		if upper >= limit {
			return h.count - h.cum[i]
		}
	}
	return math.NaN()
}

// slowLimit is the e2e target's p99: the breakdown counts each stage's
// samples over it, so that a p99 over the target shows how many of which
// stage's were slow enough to make it.
const slowLimit = 5 * time.Millisecond

// scope says whose histogram a stage reads.
type scope int

const (
	onLeader scope = iota
	onFollowers
)

// stageDef is one row of the breakdown: a histogram and whose it is.
type stageDef struct {
	key, what string
	metric    string
	labels    []string
	scope     scope
	count     bool // a number of proposals, not seconds
}

const (
	grpcTime   = "txmq_grpc_request_duration_seconds"
	raftStage  = "txmq_raft_stage_duration_seconds"
	logStore   = "txmq_raft_log_store_duration_seconds"
	applyTime  = "txmq_raft_apply_duration_seconds"
	commitTime = "txmq_store_commit_duration_seconds"
)

func method(m string) []string { return []string{"method", "/txmq.v1.ProducerService/" + m} }

// session is a request carried on a producer's session stream.
func session(m string) []string { return method("Session:" + m) }
func stage(s string) []string   { return []string{"stage", s} }

// stageDefs follow a write: the leader's handler, the batcher, the
// leader's append, replication and the followers' append, the commit and
// the apply.
var stageDefs = []stageDef{
	{"grpc_sendhalf", "gRPC handler SendHalf", grpcTime, method("SendHalf"), onLeader, false},
	{"grpc_commit", "gRPC handler EndTransaction (Commit)", grpcTime, method("EndTransaction"), onLeader, false},
	{"grpc_send", "gRPC handler Send", grpcTime, method("Send"), onLeader, false},
	{"session_sendhalf", "session handler SendHalf", grpcTime, session("SendHalf"), onLeader, false},
	{"session_commit", "session handler EndTransaction (Commit)", grpcTime, session("EndTransaction"), onLeader, false},
	{"session_send", "session handler Send", grpcTime, session("Send"), onLeader, false},
	{"proposal_wait", "proposal → raft.Apply (encode, batcher)", "txmq_raft_proposal_wait_duration_seconds", nil, onLeader, false},
	{"entry_proposals", "proposals per log entry (a count)", "txmq_raft_entry_proposals", nil, onLeader, true},
	{"entry_write", "raft.Apply → applied (the quorum write)", "txmq_raft_entry_write_duration_seconds", nil, onLeader, false},
	{"leader_dispatch", "dispatchLog (leader's log append)", raftStage, stage("raft.leader.dispatchLog"), onLeader, false},
	{"leader_log_store", "log store append", logStore, nil, onLeader, false},
	{"leader_log_sync", "its fsync, behind the append", "txmq_raft_log_sync_duration_seconds", nil, onLeader, false},
	{"append_rpc", "AppendEntries round trip to a follower", raftStage, stage("raft.replication.appendEntries.rpc"), onLeader, false},
	{"follower_decode", "request decoded", raftStage, stage("raft.net.rpcDecode"), onFollowers, false},
	{"follower_enqueue", "wait for the follower's main loop", raftStage, stage("raft.net.rpcEnqueue"), onFollowers, false},
	{"follower_append", "AppendEntries handled by the loop", raftStage, stage("raft.rpc.appendEntries"), onFollowers, false},
	{"follower_log_store", "log store append", logStore, nil, onFollowers, false},
	{"follower_respond", "loop took it → response encoded", raftStage, stage("raft.net.rpcRespond"), onFollowers, false},
	{"commit_time", "dispatch → committed (commitTime)", raftStage, stage("raft.commitTime"), onLeader, false},
	{"fsm_enqueue", "committed → handed to the FSM", raftStage, stage("raft.fsm.enqueue"), onLeader, false},
	{"leader_apply", "FSM apply of a batch", applyTime, nil, onLeader, false},
	{"follower_apply", "FSM apply of a batch", applyTime, nil, onFollowers, false},
	{"leader_store_commit", "store commit behind the apply", commitTime, nil, onLeader, false},
}

// stageRow is one stage over the window.
type stageRow struct {
	def stageDef
	h   histogram
}

// breakdown is every stage that saw work in the window.
type breakdown struct {
	leader string
	// shared: the nodes ran in one process, so raft's stages are the
	// process's (every node's), not one node's.
	shared bool
	rows   []stageRow
	notes  []string
}

// newBreakdown compares the scrapes taken when the window opened and
// closed. The leader is the node that said so when it closed.
func newBreakdown(before, after []scrape, shared bool) *breakdown {
	bd := &breakdown{shared: shared}
	leader := -1
	for i, s := range after {
		if s.gauge("txmq_raft_state", "state", "LEADER") == 1 {
			leader = i
		}
	}
	if leader < 0 {
		bd.notes = append(bd.notes, "no node was the leader when the window closed: no breakdown")
		return bd
	}
	bd.leader = fmt.Sprint("n", leader+1)
	if before[leader].gauge("txmq_raft_state", "state", "LEADER") != 1 {
		bd.notes = append(bd.notes, fmt.Sprintf("%s became the leader during the window: its figures cover part of it", bd.leader))
	}
	for _, d := range stageDefs {
		// Shared raft stages are the process's: one scrape has them all.
		nodes := []int{leader}
		if d.scope == onFollowers && !(d.metric == raftStage && shared) {
			nodes = nodes[:0]
			for i := range after {
				if i != leader {
					nodes = append(nodes, i)
				}
			}
		}
		var sum histogram
		for _, i := range nodes {
			a, ok := after[i].find(d.metric, d.labels)
			if !ok {
				continue
			}
			b, existed := before[i].find(d.metric, d.labels)
			sum = sum.plus(a.minus(b, existed))
		}
		if sum.count > 0 {
			bd.rows = append(bd.rows, stageRow{def: d, h: sum})
		}
	}
	return bd
}

func (bd *breakdown) row(key string) (histogram, bool) {
	for _, r := range bd.rows {
		if r.def.key == key {
			return r.h, true
		}
	}
	return histogram{}, false
}

// overheads pairs each client latency with the leader's handlers of it:
// the session's, or the unary call's when the client had no session.
var overheads = []struct {
	lat      string
	handlers []string
	what     string
}{
	{"half", []string{"session_sendhalf", "grpc_sendhalf"}, "SendHalf"},
	{"commit", []string{"session_commit", "grpc_commit"}, "Commit"},
	{"send", []string{"session_send", "grpc_send"}, "Send"},
}

// overhead is the client's mean latency minus the leader's mean handler
// time: the request and the answer on the wire, the client and gRPC on both
// ends, and the calls that reached a follower first. There is none for a
// one-way Commit, which returns before the handler ran.
func (bd *breakdown) overhead(r *result, lat string, handlers []string) (float64, bool) {
	s, ok := r.latency(lat)
	if !ok || s.Count == 0 || oneway(r, lat) {
		return 0, false
	}
	for _, handler := range handlers {
		if h, ok := bd.row(handler); ok {
			return s.Mean.Seconds() - h.mean(), true
		}
	}
	return 0, false
}

// oneway says that r's latency lat ends when the request is sent: Commit
// in tx-oneway.
func oneway(r *result, lat string) bool { return r.Workload == "tx-oneway" && lat == "commit" }

// wire is the AppendEntries round trip minus what the follower measured of
// it (decode, the wait for its loop, the handling and the encoded
// response): encoding on the leader, loopback both ways, reading and
// flushing, and the wake-ups in between.
func (bd *breakdown) wire() (float64, bool) {
	total := 0.0
	for i, key := range []string{"append_rpc", "follower_decode", "follower_enqueue", "follower_respond"} {
		h, ok := bd.row(key)
		if !ok {
			return 0, false
		}
		if i == 0 {
			total += h.mean()
		} else {
			total -= h.mean()
		}
	}
	return total, true
}

// line is one row of the breakdown as printed: a client latency, a stage,
// or a figure derived from them. mean, p50 and p99 are in seconds, or a
// number of proposals when isCount; p50 < 0: no quantiles. slow is how
// many samples took over slowLimit, when hasSlow.
type line struct {
	what, where    string
	count          float64
	mean, p50, p99 float64
	slow           float64
	hasSlow        bool
	isCount        bool
}

// lines are the breakdown's rows in the order they are printed: the
// client's latencies, the stages, then the derived figures.
func (bd *breakdown) lines(r *result) []line {
	var ls []line
	for _, ov := range overheads {
		if s, ok := r.latency(ov.lat); ok && s.Count > 0 {
			what := "client " + ov.what
			if oneway(r, ov.lat) {
				what += " (one-way: until sent)"
			}
			ls = append(ls, line{what: what, where: "client", count: float64(s.Count), mean: s.Mean.Seconds(), p50: s.P50.Seconds(), p99: s.P99.Seconds()})
		}
	}
	for _, row := range bd.rows {
		where := map[scope]string{onLeader: "leader", onFollowers: "followers"}[row.def.scope]
		if row.def.metric == raftStage && bd.shared {
			where = "process"
		}
		l := line{what: row.def.what, where: where, count: row.h.count, mean: row.h.mean(), p50: -1, isCount: row.def.count}
		if !row.def.count {
			// A count's buckets (1, 2, 4, ...) are too coarse for quantiles.
			l.p50, l.p99, l.slow = row.h.quantile(0.5), row.h.quantile(0.99), row.h.over(slowLimit.Seconds())
			l.hasSlow = !math.IsNaN(l.slow)
		}
		ls = append(ls, l)
	}
	for _, ov := range overheads {
		if v, ok := bd.overhead(r, ov.lat, ov.handlers); ok {
			ls = append(ls, line{what: "client overhead " + ov.what + " (client − handler)", where: "derived", mean: v, p50: -1})
		}
	}
	if v, ok := bd.wire(); ok {
		ls = append(ls, line{what: "leader ↔ follower wire (round trip − follower's)", where: "derived", mean: v, p50: -1})
	}
	return ls
}

// fields adds the breakdown to a result's JSON object (µs): each stage
// under its key, and the printed rows in order under "breakdown" (what,
// where, count, mean_us or mean for a count, p50_us, p99_us), which bench/peers
// prints beside NATS.
func (bd *breakdown) fields(r *result, o map[string]any) {
	if bd.leader != "" {
		o["breakdown_leader"] = bd.leader
	}
	for _, row := range bd.rows {
		k := "stage_" + row.def.key
		o[k+"_count"] = row.h.count
		if row.def.count {
			o[k+"_mean"] = row.h.mean()
			continue
		}
		o[k+"_mean_us"], o[k+"_p50_us"], o[k+"_p99_us"] = row.h.mean()*1e6, row.h.quantile(0.5)*1e6, row.h.quantile(0.99)*1e6
		if n := row.h.over(slowLimit.Seconds()); !math.IsNaN(n) {
			o[k+"_over_5ms"] = n
		}
	}
	for _, ov := range overheads {
		if v, ok := bd.overhead(r, ov.lat, ov.handlers); ok {
			o["overhead_"+ov.lat+"_us"] = v * 1e6
		}
	}
	if v, ok := bd.wire(); ok {
		o["stage_wire_us"] = v * 1e6
	}
	var rows []map[string]any
	for _, l := range bd.lines(r) {
		row := map[string]any{"what": l.what, "where": l.where}
		if l.count > 0 {
			row["count"] = l.count
		}
		if l.isCount {
			row["mean"] = l.mean
		} else {
			row["mean_us"] = l.mean * 1e6
		}
		if l.p50 >= 0 {
			row["p50_us"], row["p99_us"] = l.p50*1e6, l.p99*1e6
		}
		if l.hasSlow {
			row["over_5ms"] = l.slow
		}
		rows = append(rows, row)
	}
	if len(rows) > 0 {
		o["breakdown"] = rows
	}
	if len(bd.notes) > 0 {
		o["breakdown_notes"] = bd.notes
	}
}

// write prints the breakdown as a table under the run's figures (ms).
func (bd *breakdown) write(w io.Writer, r *result) {
	fmt.Fprintf(w, "   breakdown over the window: /metrics of the leader (%s) and the followers; mean, and p50 and p99 read from the histogram's buckets; over 5 ms: how many surely took longer (counted from the first bucket bound at or above it)\n", bd.leader)
	fmt.Fprintf(w, "   %-50s %-9s %8s %9s %9s %9s %9s  (ms)\n", "stage", "where", "count", "mean", "p50", "p99", "over 5 ms")
	for _, l := range bd.lines(r) {
		count := ""
		if l.count > 0 {
			count = fmt.Sprintf("%.0f", l.count)
		}
		switch {
		case l.isCount:
			fmt.Fprintf(w, "   %-50s %-9s %8s %9.2f %9s  (proposals, not ms)\n", l.what, l.where, count, l.mean, "–")
		case l.p50 < 0:
			fmt.Fprintf(w, "   %-50s %-9s %8s %9.3f\n", l.what, l.where, count, ms(l.mean))
		case !l.hasSlow:
			fmt.Fprintf(w, "   %-50s %-9s %8s %9.3f %9.3f %9.3f\n", l.what, l.where, count, ms(l.mean), ms(l.p50), ms(l.p99))
		default:
			fmt.Fprintf(w, "   %-50s %-9s %8s %9.3f %9.3f %9.3f %9.0f\n", l.what, l.where, count, ms(l.mean), ms(l.p50), ms(l.p99), l.slow)
		}
	}
	if bd.shared {
		fmt.Fprintln(w, "   note: the nodes share this process, so raft's stages (\"process\") are every node's")
	}
	for _, n := range bd.notes {
		fmt.Fprintf(w, "   note: %s\n", n)
	}
}

func ms(seconds float64) float64 { return seconds * 1e3 }
