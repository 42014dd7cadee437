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
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

// Observability: Prometheus metrics on /metrics, liveness on /healthz,
// readiness on /readyz (a leader is known and the store is open), and the
// standard gRPC health service. Names follow Prometheus conventions:
// txmq_ prefix, base units, _total for counters, _seconds for durations.

type metrics struct {
	reg          *prometheus.Registry
	grpcRequests *prometheus.CounterVec
	grpcDuration *prometheus.HistogramVec
	checks       *prometheus.CounterVec
	checkTime    *prometheus.HistogramVec
	delivered    *prometheus.CounterVec
	redelivered  *prometheus.CounterVec
	acked        *prometheus.CounterVec
	deadLettered *prometheus.CounterVec
	trimmed      *prometheus.CounterVec
	pruned       prometheus.Counter
	state        *stateCollector
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
	m.reg.MustRegister(m.collectors()...)
	return m
}

// collectors are what the registry exports. The state collector reads the
// broker only when scraped.
func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.grpcRequests, m.grpcDuration, m.checks, m.checkTime, m.delivered, m.redelivered, m.acked, m.deadLettered, m.trimmed, m.pruned,
		m.state,
	}
}

// unary counts and times unary calls.
func (m *metrics) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.grpcDuration.WithLabelValues(info.FullMethod).Observe(time.Since(start).Seconds())
	m.grpcRequests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return resp, err
}

// stream counts streams when they end.
func (m *metrics) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, ss)
	m.grpcRequests.WithLabelValues(info.FullMethod, status.Code(err).String()).Inc()
	return err
}

// stateCollector reads the node's state at scrape time.
type stateCollector struct{ b *Broker }

var (
	descRaftState = prometheus.NewDesc("txmq_raft_state",
		"1 for this node's current Raft state.", []string{"state"}, nil)
	descRaftTerm = prometheus.NewDesc("txmq_raft_term",
		"Current Raft term.", nil, nil)
	descRaftCommit = prometheus.NewDesc("txmq_raft_commit_index",
		"Raft commit index.", nil, nil)
	descRaftApplied = prometheus.NewDesc("txmq_raft_applied_index",
		"Raft index applied to the state machine.", nil, nil)
	descRaftLeader = prometheus.NewDesc("txmq_raft_has_leader",
		"1 when this node knows a leader.", nil, nil)
	descStoreApplied = prometheus.NewDesc("txmq_store_applied_index",
		"Raft index recorded in the bbolt store.", nil, nil)
	descStoreSize = prometheus.NewDesc("txmq_store_file_size_bytes",
		"Size of the bbolt state machine file.", nil, nil)
	descStoreFree = prometheus.NewDesc("txmq_store_free_pages",
		"Free pages in the bbolt state machine file.", nil, nil)
	descApplied = prometheus.NewDesc("txmq_raft_applied_entries_total",
		"Log entries this node's state machine applied since start.", nil, nil)
	descBatches = prometheus.NewDesc("txmq_raft_apply_batches_total",
		"bbolt transactions that carried those entries (one fsync each).", nil, nil)
	descPending = prometheus.NewDesc("txmq_half_messages_pending",
		"Half messages waiting for a resolution, by producer group.", []string{"group"}, nil)
	descExpired = prometheus.NewDesc("txmq_half_messages_expired",
		"Expired half messages parked for an operator.", nil, nil)
	descOldest = prometheus.NewDesc("txmq_half_oldest_pending_age_seconds",
		"Age of the oldest pending half message (0 when none).", nil, nil)
	descProducers = prometheus.NewDesc("txmq_checkback_producer_instances",
		"Producer instances registered on this node (the leader), by group.", []string{"group"}, nil)
	descCommitted = prometheus.NewDesc("txmq_topic_last_sequence",
		"Sequence of the last committed message of a topic.", []string{"topic"}, nil)
	descLag = prometheus.NewDesc("txmq_group_lag_messages",
		"Committed messages a consumer group has not acked, by topic and group.", []string{"topic", "group"}, nil)
	descLagAge = prometheus.NewDesc("txmq_group_oldest_unacked_age_seconds",
		"Age of the oldest committed message a consumer group has not acked (0 when none), by topic and group.", []string{"topic", "group"}, nil)
	descDeadLetters = prometheus.NewDesc("txmq_group_dead_letters",
		"Messages in a consumer group's dead-letter queue, by topic and group.", []string{"topic", "group"}, nil)
	descRetrying = prometheus.NewDesc("txmq_group_retrying_messages",
		"Messages waiting for redelivery after a failed delivery, by topic and group.", []string{"topic", "group"}, nil)
	descDropped = prometheus.NewDesc("txmq_group_dropped_messages",
		"Messages retention dropped before the group acked them, by topic and group.", []string{"topic", "group"}, nil)
	descTopicBytes = prometheus.NewDesc("txmq_topic_retained_bytes",
		"Size of the messages a topic's log retains, by topic.", []string{"topic"}, nil)
	descInFlight = prometheus.NewDesc("txmq_group_in_flight",
		"Deliveries waiting for an ack (on the leader), by topic and group.", []string{"topic", "group"}, nil)
	descSubscribers = prometheus.NewDesc("txmq_group_subscribers",
		"Consumer streams connected (on the leader), by topic and group.", []string{"topic", "group"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descRaftTerm, descRaftCommit, descRaftApplied, descRaftLeader,
		descStoreApplied, descStoreSize, descStoreFree, descApplied, descBatches, descPending, descExpired, descOldest, descProducers,
		descCommitted, descLag, descLagAge, descDeadLetters, descRetrying, descDropped, descTopicBytes, descInFlight, descSubscribers} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.b
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if st, err := b.node.Status(); err == nil {
		for _, s := range []string{"LEADER", "FOLLOWER", "CANDIDATE", "SHUTDOWN"} {
			v := 0.0
			if stateName(st.State) == s {
				v = 1
			}
			gauge(descRaftState, v, s)
		}
		gauge(descRaftTerm, float64(st.Term))
		gauge(descRaftCommit, float64(st.CommitIndex))
		gauge(descRaftApplied, float64(st.AppliedIndex))
		gauge(descStoreApplied, float64(st.StoreAppliedIndex))
		leader := 0.0
		if st.LeaderID != "" {
			leader = 1
		}
		gauge(descRaftLeader, leader)
	}
	if st, err := b.node.Store().Stats(); err == nil {
		gauge(descStoreSize, float64(st.FileSize))
		gauge(descStoreFree, float64(st.FreePages))
	}
	ch <- prometheus.MustNewConstMetric(descApplied, prometheus.CounterValue, float64(b.node.AppliedByFSM()))
	ch <- prometheus.MustNewConstMetric(descBatches, prometheus.CounterValue, float64(b.node.AppliedBatches()))
	_ = b.node.Store().View(func(tx *halfstore.Tx) error {
		pending, err := tx.PendingByGroup()
		if err != nil {
			return err
		}
		for g, n := range pending {
			gauge(descPending, float64(n), g)
		}
		gauge(descExpired, float64(tx.CountState(storepb.HalfState_HALF_STATE_EXPIRED)))
		age := 0.0
		if id, ok := tx.FirstInState(storepb.HalfState_HALF_STATE_PENDING); ok {
			if created, ok := idTime(id); ok {
				age = max(b.cfg.Now().Sub(created).Seconds(), 0)
			}
		}
		gauge(descOldest, age)
		topics, err := tx.Topics()
		if err != nil {
			return err
		}
		for _, tp := range topics {
			gauge(descCommitted, float64(tp.LastSequence), tp.Name)
			gauge(descTopicBytes, float64(tp.Bytes), tp.Name)
			groups, err := tx.Groups(tp.Name)
			if err != nil {
				return err
			}
			for _, g := range groups {
				lag, err := tx.Lag(tp.Name, g.Name)
				if err != nil {
					return err
				}
				age := 0.0
				if lag.OldestUnacked != 0 {
					age = max(b.cfg.Now().Sub(time.Unix(0, lag.OldestUnacked)).Seconds(), 0)
				}
				gauge(descLag, float64(lag.Lag), tp.Name, g.Name)
				gauge(descLagAge, age, tp.Name, g.Name)
				gauge(descDeadLetters, float64(g.DeadLetters), tp.Name, g.Name)
				gauge(descRetrying, float64(g.Retrying), tp.Name, g.Name)
				gauge(descDropped, float64(g.Dropped), tp.Name, g.Name)
				inFlight, subs := b.DeliveryStats(tp.Name, g.Name)
				gauge(descInFlight, float64(inFlight), tp.Name, g.Name)
				gauge(descSubscribers, float64(subs), tp.Name, g.Name)
			}
		}
		return nil
	})
	perGroup := map[string]int{}
	for _, in := range b.checks.Registry().List("") {
		perGroup[in.Group]++
	}
	for g, n := range perGroup {
		gauge(descProducers, float64(n), g)
	}
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

// watchHealth keeps the gRPC health service in step with readiness.
func (b *Broker) watchHealth(hs *health.Server) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if b.ready() != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		hs.SetServingStatus("", st)
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
