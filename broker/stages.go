package broker

import (
	"strings"
	"sync"
	"time"

	gometrics "github.com/hashicorp/go-metrics/compat"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/txmq/txmq/raftlog"
)

// The stages of a write, as histograms (docs/operations.md, Metrics; the
// table of docs/benchmarks.md, "Where a write's time goes"): the batcher's
// wait and merge and the quorum write, from raftlog.Hooks; the log store,
// apply and store commit (metrics.go); and what only hashicorp/raft knows,
// from its go-metrics timings.

// stageBuckets: 20 µs to 10 s in steps of about 1.5×, fine enough that a
// p50 read from the buckets is within a few tens of percent.
var stageBuckets = prometheus.ExponentialBucketsRange(20e-6, 10, 34)

// stageHistograms time the batcher and the quorum write on the leader.
func (m *metrics) stageHistograms() {
	m.proposalWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_proposal_wait_duration_seconds",
		Help:    "Time from a proposal until its log entry was handed to raft.Apply: its encoding and its wait in the batcher while earlier entries were being replicated (on the leader).",
		Buckets: stageBuckets,
	})
	m.entryProposals = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_entry_proposals",
		Help:    "Proposals merged into one Raft log entry by the batcher (on the leader).",
		Buckets: prometheus.ExponentialBuckets(1, 2, 10),
	})
	m.entryWrite = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_entry_write_duration_seconds",
		Help:    "Time from raft.Apply of one log entry until this node applied it: the leader's log append, replication, a quorum's append, the commit and the apply (on the leader).",
		Buckets: stageBuckets,
	})
}

// stageHooks are the batcher's hooks; hooks() chains them with the rest.
func (m *metrics) stageHooks(next raftlog.Hooks) (proposed func([]time.Duration), replicated func(time.Duration)) {
	proposed = func(waited []time.Duration) {
		m.entryProposals.Observe(float64(len(waited)))
		for _, d := range waited {
			m.proposalWait.Observe(d.Seconds())
		}
		if next.Proposed != nil {
			next.Proposed(waited)
		}
	}
	replicated = func(d time.Duration) {
		m.entryWrite.Observe(d.Seconds())
		if next.Replicated != nil {
			next.Replicated(d)
		}
	}
	return proposed, replicated
}

// raftStages is hashicorp/raft's own timings of the write path. raft
// reports them through go-metrics' global sink, one per process, so this
// histogram is one per process too and every broker's registry exports
// it: brokers started in one process (tests, txmq-bench --inprocess) each
// show the sum of all of them.
var raftStages = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "txmq_raft_stage_duration_seconds",
	Help:    "hashicorp/raft's timings of the write path by stage, its metric key (raft.commitTime, raft.leader.dispatchLog, raft.replication.appendEntries.rpc, raft.rpc.appendEntries.storeLogs, ...). One per process: brokers in one process share it.",
	Buckets: stageBuckets,
}, []string{"stage"})

// raftStageKeys are the keys raftStages keeps (all timers, in ms); the
// transport's are kept for AppendEntries only, not heartbeats or votes.
var raftStageKeys = []struct {
	key       string
	transport bool
}{
	{"raft.leader.dispatchLog", false},            // leader: its own log append of new entries
	{"raft.replication.appendEntries.rpc", false}, // leader: one AppendEntries round trip to a follower
	{"raft.commitTime", false},                    // leader: entry dispatched → committed
	{"raft.fsm.enqueue", false},                   // leader: committed entries handed to the FSM goroutine
	{"raft.fsm.applyBatch", false},                // every node: one FSM batch
	{"raft.net.rpcDecode", true},                  // follower: decoding the request
	{"raft.net.rpcEnqueue", true},                 // follower: until its main loop took the request
	{"raft.net.rpcRespond", true},                 // follower: until the response was encoded
	{"raft.rpc.appendEntries", false},             // follower: the main loop's handling of the request
	{"raft.rpc.appendEntries.storeLogs", false},   // follower: its log append
	{"raft.rpc.appendEntries.processLogs", false}, // follower: advancing its commit index
}

// raftStageObservers are raftStages' series by key, made once, so that a
// sample costs a map lookup and an observation.
var raftStageObservers = func() map[string]stageObserver {
	out := map[string]stageObserver{}
	for _, k := range raftStageKeys {
		out[k.key] = stageObserver{transport: k.transport, obs: raftStages.WithLabelValues(k.key)}
	}
	return out
}()

type stageObserver struct {
	transport bool
	obs       prometheus.Observer
}

var installRaftSink sync.Once

// installRaftStages points go-metrics' global sink at raftStages, once per
// process. The compat package is the go-metrics raft v1.7.3 reports to:
// armon/go-metrics unless built with the hashicorpmetrics tag.
func installRaftStages() {
	installRaftSink.Do(func() {
		cfg := gometrics.DefaultConfig("")
		cfg.EnableHostname, cfg.HostName = false, ""
		// Its runtime statistics would be a goroutine sampling every second
		// for nothing: the Go collector exports them.
		cfg.EnableRuntimeMetrics = false
		// New cannot fail: it only copies the config.
		_, _ = gometrics.NewGlobal(cfg, stageSink{})
	})
}

// stageSink turns the chosen go-metrics timers into raftStages and drops
// everything else (counters, gauges, other timers).
type stageSink struct{}

func (stageSink) AddSampleWithLabels(key []string, ms float32, labels []gometrics.Label) {
	o, ok := raftStageObservers[strings.Join(key, ".")]
	if !ok || (o.transport && !hasLabel(labels, "rpcType", "AppendEntries")) {
		return
	}
	o.obs.Observe(float64(ms) / 1e3)
}

func hasLabel(labels []gometrics.Label, name, value string) bool {
	for _, l := range labels {
		if l.Name == name && l.Value == value {
			return true
		}
	}
	return false
}

func (s stageSink) AddSample(key []string, ms float32) { s.AddSampleWithLabels(key, ms, nil) }

func (stageSink) SetGauge([]string, float32)                                 {}
func (stageSink) SetGaugeWithLabels([]string, float32, []gometrics.Label)    {}
func (stageSink) EmitKey([]string, float32)                                  {}
func (stageSink) IncrCounter([]string, float32)                              {}
func (stageSink) IncrCounterWithLabels([]string, float32, []gometrics.Label) {}
