package broker

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/buildinfo"
	"github.com/txmq/txmq/raftlog"
)

// Observability: Prometheus metrics on /metrics, liveness on /healthz,
// readiness on /readyz (a leader is known and the store is open), and the
// standard gRPC health service. Names follow Prometheus conventions:
// txmq_ prefix, base units, _total for counters, _seconds for durations.
//
// Where a metric comes from decides whose view it is. Half message
// resolutions, Raft and storage metrics come from what this node applied
// or wrote, so every node counts them. Delivery metrics and check-back
// calls come from the leader's work: each node counts what it did while
// it led; sum them over the nodes.

// latencyBuckets span a message's life: milliseconds on a quiet node to an
// hour behind a stuck consumer, with 5 s and 10 s bounds for the SLO
// (docs/operations.md › SLOs).
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// halfAgeBuckets: from a producer's own commit (milliseconds) to the
// default max_half_age (24 h).
var halfAgeBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600, 1800, 3600, 21600, 86400}

// storageBuckets: the check-back scan's store reads, 100 µs to 6.5 s.
var storageBuckets = prometheus.ExponentialBuckets(0.0001, 2, 17)

type metrics struct {
	reg          *prometheus.Registry
	grpcRequests *prometheus.CounterVec
	grpcDuration *prometheus.HistogramVec
	checks       *prometheus.CounterVec
	checkTime    *prometheus.HistogramVec
	checkScan    prometheus.Histogram
	delivered    *prometheus.CounterVec
	redelivered  *prometheus.CounterVec
	acked        *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	trimmed      *prometheus.CounterVec
	pruned       prometheus.Counter

	// Half messages, from the FSM's EventResolved.
	resolved       *prometheus.CounterVec
	resolutionTime *prometheus.HistogramVec
	checkAttempts  *prometheus.HistogramVec

	// Latencies along a message's life, on the leader that delivered it.
	commitToFirst *prometheus.HistogramVec
	firstToAck    *prometheus.HistogramVec
	commitToAck   *prometheus.HistogramVec

	// Raft and storage, from raftlog.Hooks.
	applyBatch   prometheus.Histogram
	applyTime    prometheus.Histogram
	commitTime   prometheus.Histogram
	logStoreTime prometheus.Histogram
	logSyncTime  prometheus.Histogram
	snapshotTime prometheus.Histogram

	// The batcher and the quorum write, from raftlog.Hooks (stages.go).
	proposalWait   prometheus.Histogram
	entryProposals prometheus.Histogram
	entryWrite     prometheus.Histogram

	// Auth and limits (auth.go, limits.go).
	audit   *prometheus.CounterVec
	limit   *prometheus.GaugeVec
	limited *prometheus.CounterVec
	// Open streams and connections per principal.
	principalStreams, principalConns *prometheus.GaugeVec

	state *stateCollector
	build *prometheus.GaugeVec
}

func newMetrics(b *Broker) *metrics {
	m := &metrics{
		reg:   prometheus.NewRegistry(),
		state: &stateCollector{b: b},
		grpcRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "txmq_grpc_requests_total",
			Help: "gRPC calls served, by method and status code.",
		}, []string{"method", "code"}),
		grpcDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "txmq_grpc_request_duration_seconds",
			Help:    "Time to serve a unary gRPC call, by method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"method"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "txmq_checkback_calls_total",
			Help: "Check-back calls by producer group and result (commit, rollback, unknown, error, timeout, not_reached, no_instance).",
		}, []string{"group", "result"}),
		checkTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "txmq_checkback_call_duration_seconds",
			Help:    "Time a producer took to answer a check-back, by producer group.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 13),
		}, []string{"group"}),
	}
	groupCounter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"topic", "group"})
	}
	m.delivered = groupCounter("txmq_messages_delivered_total", "Deliveries pushed to consumer streams (redeliveries included), by topic and consumer group.")
	m.redelivered = groupCounter("txmq_messages_redelivered_total", "Deliveries after the first attempt, by topic and consumer group.")
	m.acked = groupCounter("txmq_messages_acked_total", "Acks replicated, by topic and consumer group.")
	m.deadLettered = groupCounter("txmq_messages_dead_lettered_total", "Messages moved to a consumer group's dead-letter queue after max_deliveries, by topic and group.")
	m.trimmed = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "txmq_messages_trimmed_total",
		Help: "Committed messages dropped by retention (age or size), by topic.",
	}, []string{"topic"})
	m.pruned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "txmq_records_pruned_total",
		Help: "Resolved half messages and expired dedup keys deleted by the leader's cleanup.",
	})
	m.checkScan = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_checkback_scan_duration_seconds",
		Help:    "Time one look at the check-back schedule took (on the leader). Seconds here mean the schedule is too big or the store too slow.",
		Buckets: storageBuckets,
	})
	m.resolved = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "txmq_half_messages_resolved_total",
		Help: "Half messages that left PENDING (or EXPIRED, by an operator), as this node applied them, by producer group, state reached (committed, rolled_back, expired) and source (producer, checkback, operator, expiry).",
	}, []string{"group", "state", "source"})
	m.resolutionTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "txmq_half_resolution_seconds",
		Help:    "Time from SendHalf to the resolution (commit, rollback or expiry), as this node applied it, by producer group and source.",
		Buckets: halfAgeBuckets,
	}, []string{"group", "source"})
	m.checkAttempts = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "txmq_half_check_attempts_at_resolution",
		Help:    "Check-backs that had reached a producer when a half message was resolved, as this node applied it, by producer group.",
		Buckets: []float64{0, 1, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50},
	}, []string{"group"})
	latency := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: latencyBuckets}, []string{"topic", "group"})
	}
	m.commitToFirst = latency("txmq_message_commit_to_first_delivery_seconds",
		"Time from a message's commit to its first delivery to the consumer group (on the leader), by topic and group.")
	m.firstToAck = latency("txmq_message_first_delivery_to_ack_seconds",
		"Time from a message's first delivery by this leader to the group's replicated ack, by topic and group.")
	m.commitToAck = latency("txmq_message_commit_to_ack_seconds",
		"End to end: time from a message's commit to the group's replicated ack (on the leader), by topic and group. The SLO metric.")
	m.build = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "txmq_build_info",
		Help: "1, labelled with what the broker was built from: module version, VCS revision, Go version (broker --version).",
	}, []string{"version", "revision", "go_version"})
	info := buildinfo.Get()
	m.build.WithLabelValues(info.Version, info.Revision, info.GoVersion).Set(1)
	m.storageHistograms()
	m.stageHistograms()
	m.securityMetrics()
	m.reg.MustRegister(m.collectors()...)
	return m
}

// storageHistograms time the node's Raft log, state machine and snapshots.
// The log, apply and commit ones are stages of every write, with the
// stages' finer buckets.
func (m *metrics) storageHistograms() {
	m.applyBatch = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_apply_batch_entries",
		Help:    "Commands applied in one batch by this node's state machine.",
		Buckets: prometheus.ExponentialBuckets(1, 2, 11),
	})
	m.applyTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_apply_duration_seconds",
		Help:    "Time to apply one batch of committed entries on this node, in the store's open transaction; proposers are answered after it.",
		Buckets: stageBuckets,
	})
	m.commitTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_store_commit_duration_seconds",
		Help:    "Time of one commit of the state machine's store on this node, behind the applied batches it carries (no fsync; the store is fsynced once a second).",
		Buckets: stageBuckets,
	})
	m.logStoreTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_log_store_duration_seconds",
		Help:    "Time of one write of entries to this node's Raft log: with its fsync, except on a leader that syncs behind its appends (txmq_raft_log_sync_duration_seconds).",
		Buckets: stageBuckets,
	})
	m.logSyncTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_log_sync_duration_seconds",
		Help:    "Time of one fsync of the leader's Raft log behind its appends (while they replicate; nothing is applied before it).",
		Buckets: stageBuckets,
	})
	m.snapshotTime = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "txmq_raft_snapshot_duration_seconds",
		Help:    "Time to write one snapshot of this node's store.",
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	})
}

// hooks turns the node's proposal and storage timings into metrics, then
// passes them on to the hooks the broker's owner set, if any.
func (m *metrics) hooks(next raftlog.Hooks) raftlog.Hooks {
	proposed, replicated := m.stageHooks(next)
	return raftlog.Hooks{
		Proposed:   proposed,
		Replicated: replicated,
		Applied: func(entries int, d time.Duration) {
			m.applyBatch.Observe(float64(entries))
			m.applyTime.Observe(d.Seconds())
			if next.Applied != nil {
				next.Applied(entries, d)
			}
		},
		Committed: func(d time.Duration) {
			m.commitTime.Observe(d.Seconds())
			if next.Committed != nil {
				next.Committed(d)
			}
		},
		LogStored: func(entries int, d time.Duration) {
			m.logStoreTime.Observe(d.Seconds())
			if next.LogStored != nil {
				next.LogStored(entries, d)
			}
		},
		LogSynced: func(d time.Duration) {
			m.logSyncTime.Observe(d.Seconds())
			if next.LogSynced != nil {
				next.LogSynced(d)
			}
		},
		SnapshotPersisted: func(d time.Duration) {
			m.snapshotTime.Observe(d.Seconds())
			if next.SnapshotPersisted != nil {
				next.SnapshotPersisted(d)
			}
		},
	}
}

// observeResolved counts a half message the FSM took out of PENDING.
func (m *metrics) observeResolved(h *storepb.Half) {
	source := sourceLabel(h.ResolutionSource)
	m.resolved.WithLabelValues(h.ProducerGroup, stateLabel(h.State), source).Inc()
	m.resolutionTime.WithLabelValues(h.ProducerGroup, source).Observe(max(time.Duration(h.ResolvedAt-h.CreatedAt), 0).Seconds())
	m.checkAttempts.WithLabelValues(h.ProducerGroup).Observe(float64(h.CheckAttempts))
}

func stateLabel(s storepb.HalfState) string {
	switch s {
	case storepb.HalfState_HALF_STATE_COMMITTED:
		return "committed"
	case storepb.HalfState_HALF_STATE_ROLLED_BACK:
		return "rolled_back"
	case storepb.HalfState_HALF_STATE_EXPIRED:
		return "expired"
	}
	return "pending"
}

func sourceLabel(s storepb.Source) string {
	switch s {
	case storepb.Source_SOURCE_PRODUCER:
		return "producer"
	case storepb.Source_SOURCE_CHECKBACK:
		return "checkback"
	case storepb.Source_SOURCE_OPERATOR:
		return "operator"
	case storepb.Source_SOURCE_EXPIRY:
		return "expiry"
	}
	return "unknown"
}

// collectors are what the registry exports. The state collector reads the
// broker only when scraped.
func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.grpcRequests, m.grpcDuration, m.checks, m.checkTime, m.checkScan, m.delivered, m.redelivered, m.acked, m.deadLettered, m.trimmed, m.pruned,
		m.resolved, m.resolutionTime, m.checkAttempts, m.commitToFirst, m.firstToAck, m.commitToAck,
		m.applyBatch, m.applyTime, m.commitTime, m.logStoreTime, m.logSyncTime, m.snapshotTime,
		m.proposalWait, m.entryProposals, m.entryWrite, raftStages,
		m.state, m.build,
	}
}

// unary counts and times unary calls.
func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.observeCall(info.FullMethod, start, status.Code(err))
	return resp, err
}

// observeCall counts and times one call, or one request of a session.
func (m *metrics) observeCall(method string, start time.Time, code codes.Code) {
	m.grpcDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	m.grpcRequests.WithLabelValues(method, code.String()).Inc()
}

// stream counts streams when they end.
func (m *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, ss)
	m.grpcRequests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return err
}

// newHTTPServer serves /metrics, /healthz and /readyz.
func (b *Broker) newHTTPServer() *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(b.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := b.ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ready\n"))
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// ready: a leader is known and the store is open.
func (b *Broker) ready() error {
	if id, _ := b.node.Leader(); id == "" {
		return errors.New("no leader")
	}
	if _, err := b.node.Store().AppliedIndex(); err != nil {
		return err
	}
	return nil
}

// watchHealth keeps the gRPC health service in step with the node: the
// server as a whole ("") and AdminService serve while the node is ready
// (it knows a leader and its store is open), since every node answers
// the admin reads and follows the leader for the rest; ProducerService
// and ConsumerService serve on the leader only, since a follower answers
// their calls with NotLeader. A health check by service name thus finds
// the node to send writes and subscriptions to.
func (b *Broker) watchHealth(hs *health.Server) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	serving := func(ok bool) healthpb.HealthCheckResponse_ServingStatus {
		if ok {
			return healthpb.HealthCheckResponse_SERVING
		}
		return healthpb.HealthCheckResponse_NOT_SERVING
	}
	for {
		ready := b.ready() == nil
		leads := ready && b.node.IsLeader()
		hs.SetServingStatus("", serving(ready))
		hs.SetServingStatus(txmqv1.AdminService_ServiceDesc.ServiceName, serving(ready))
		hs.SetServingStatus(txmqv1.ProducerService_ServiceDesc.ServiceName, serving(leads))
		hs.SetServingStatus(txmqv1.ConsumerService_ServiceDesc.ServiceName, serving(leads))
		select {
		case <-b.stop:
			hs.Shutdown()
			return
		case <-t.C:
		}
	}
}

// observeCheck records one check-back call (checkback.Config.Observe).
func (m *metrics) observeCheck(group, result string, took time.Duration) {
	m.checks.WithLabelValues(group, result).Inc()
	if result != "no_instance" {
		m.checkTime.WithLabelValues(group).Observe(took.Seconds())
	}
}
