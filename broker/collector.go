package broker

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

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
		"Expired half messages parked for an operator, by producer group (absent when none).", []string{"group"}, nil)
	descOldest = prometheus.NewDesc("txmq_half_oldest_pending_age_seconds",
		"Age of the oldest pending half message, by producer group (absent when none is pending).", []string{"group"}, nil)
	descStaticCallback = prometheus.NewDesc("txmq_checkback_static_callback",
		"1 for a producer group with pending half messages and a callback URL of its own (brokerctl group config --callback): it is checked back without registered instances.", []string{"group"}, nil)
	descPendingAge = prometheus.NewDesc("txmq_half_messages_pending_by_age",
		"Pending half messages older than older_than (6s, 1m, 10m, 1h, 6h; cumulative), by producer group.", []string{"group", "older_than"}, nil)
	descCommittedTotal = prometheus.NewDesc("txmq_messages_committed_total",
		"Messages committed to a topic (plain sends and committed half messages): the topic's last sequence, the same on every node.", []string{"topic"}, nil)
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

// pendingAges are the thresholds of txmq_half_messages_pending_by_age: the
// default first check, then what an operator would call late, very late,
// and forgotten.
var pendingAges = []struct {
	label string
	age   time.Duration
}{{"6s", 6 * time.Second}, {"1m", time.Minute}, {"10m", 10 * time.Minute}, {"1h", time.Hour}, {"6h", 6 * time.Hour}}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descRaftState, descRaftTerm, descRaftCommit, descRaftApplied, descRaftLeader,
		descStoreApplied, descStoreSize, descStoreFree, descApplied, descBatches, descPending, descExpired, descOldest, descStaticCallback, descPendingAge, descProducers, descCommittedTotal,
		descCommitted, descLag, descLagAge, descDeadLetters, descRetrying, descDropped, descTopicBytes, descInFlight, descSubscribers} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	b := c.b
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, labels...)
	}
	c.collectNode(gauge, counter)
	now := b.clock.Now()
	_ = b.node.Store().View(func(tx *halfstore.Tx) error {
		if err := c.collectHalf(tx, now, gauge); err != nil {
			return err
		}
		return eachGroup(tx, func(tp *storepb.Topic, g *storepb.Group, lag halfstore.GroupLag) {
			if g == nil {
				gauge(descCommitted, float64(tp.LastSequence), tp.Name)
				counter(descCommittedTotal, float64(tp.LastSequence), tp.Name)
				gauge(descTopicBytes, float64(tp.Bytes), tp.Name)
				return
			}
			age := 0.0
			if a := lagAge(now, lag); a != nil {
				age = a.Seconds()
			}
			gauge(descLag, float64(lag.Lag), tp.Name, g.Name)
			gauge(descLagAge, age, tp.Name, g.Name)
			gauge(descDeadLetters, float64(g.DeadLetters), tp.Name, g.Name)
			gauge(descRetrying, float64(g.Retrying), tp.Name, g.Name)
			gauge(descDropped, float64(g.Dropped), tp.Name, g.Name)
			inFlight, subs := b.DeliveryStats(tp.Name, g.Name)
			gauge(descInFlight, float64(inFlight), tp.Name, g.Name)
			gauge(descSubscribers, float64(subs), tp.Name, g.Name)
		})
	})
	perGroup := map[string]int{}
	for _, in := range b.checks.Registry().List("") {
		perGroup[in.Group]++
	}
	for g, n := range perGroup {
		gauge(descProducers, float64(n), g)
	}
}

type emit func(d *prometheus.Desc, v float64, labels ...string)

// collectNode reports the node's Raft state and its store file.
func (c *stateCollector) collectNode(gauge, counter emit) {
	b := c.b
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
	counter(descApplied, float64(b.node.AppliedByFSM()))
	counter(descBatches, float64(b.node.AppliedBatches()))
}

// collectHalf reports, by producer group, the half messages pending (by
// age too), the oldest one, and those expired.
func (c *stateCollector) collectHalf(tx *halfstore.Tx, now time.Time, gauge emit) error {
	ages := make([]time.Duration, len(pendingAges))
	for i, a := range pendingAges {
		ages[i] = a.age
	}
	groups, err := readHalfGroups(tx, now, ages)
	if err != nil {
		return err
	}
	for g, hg := range groups {
		if hg.expired > 0 {
			gauge(descExpired, float64(hg.expired), g)
		}
		if !hg.scheduled {
			continue
		}
		gauge(descPending, float64(hg.pending), g)
		if hg.oldest != 0 {
			gauge(descOldest, max(now.Sub(time.UnixMilli(hg.oldest)).Seconds(), 0), g)
		}
		for i, a := range pendingAges {
			gauge(descPendingAge, float64(hg.olderThan[i]), g, a.label)
		}
		pg, err := tx.ProducerGroup(g)
		if err != nil {
			return err
		}
		if pg.CallbackUrl != "" {
			gauge(descStaticCallback, 1, g)
		}
	}
	return nil
}

// halfGroup is a producer group's half messages waiting for a producer or
// an operator.
type halfGroup struct {
	// scheduled: the group has a check schedule, maybe empty.
	scheduled bool
	pending   int
	// oldest is when the oldest pending one was stored (Unix ms); zero
	// when none is.
	oldest int64
	// olderThan counts the pending ones older than each of the ages
	// readHalfGroups was given.
	olderThan []int
	expired   int
}

// maxExpiredRead bounds the expired half messages one read counts; expired
// ones wait for an operator, so there are few.
const maxExpiredRead = 100000

// readHalfGroups counts each producer group's pending half messages from
// the schedule index, with the oldest and how many are older than each of
// ages at now, and counts the expired ones, which have no index by group:
// their records are read. The pending ones are walked by key alone, the
// creation time read from the message ID, without a copy or an
// allocation: a scrape of the metrics does this on every node, and a
// backlog can hold millions.
func readHalfGroups(tx *halfstore.Tx, now time.Time, ages []time.Duration) (map[string]*halfGroup, error) {
	out := map[string]*halfGroup{}
	group := func(g string) *halfGroup {
		if out[g] == nil {
			out[g] = &halfGroup{olderThan: make([]int, len(ages))}
		}
		return out[g]
	}
	names, err := tx.ScheduledGroups()
	if err != nil {
		return nil, err
	}
	// A message is older than ages[i] when it was created before cutoff[i]
	// (Unix ns).
	cutoff := make([]int64, len(ages))
	for i, a := range ages {
		cutoff[i] = now.Add(-a).UnixNano()
	}
	for _, g := range names {
		hg := group(g)
		hg.scheduled = true
		tx.PendingIDs(g, func(id []byte) {
			hg.pending++
			created, ok := idMillis(id)
			if !ok {
				return
			}
			if hg.oldest == 0 || created < hg.oldest {
				hg.oldest = created
			}
			for i, c := range cutoff {
				if created*int64(time.Millisecond) < c {
					hg.olderThan[i]++
				}
			}
		})
	}
	expired, err := tx.ListHalf("", storepb.HalfState_HALF_STATE_EXPIRED, "", maxExpiredRead)
	if err != nil {
		return nil, err
	}
	for _, h := range expired {
		group(h.ProducerGroup).expired++
	}
	return out, nil
}
