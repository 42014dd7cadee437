package broker

import (
	"context"
	"sort"
	"time"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

// GetStats answers brokerctl stats from the same sources as /metrics: the
// store for what is pending and unacked now, the leader's counters for
// what happened since it started.
func (s *adminService) GetStats(ctx context.Context, _ *txmqv1.GetStatsRequest) (*txmqv1.GetStatsResponse, error) {
	b := s.b
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	st, err := b.node.Status()
	if err != nil {
		return nil, err
	}
	c, err := b.metrics.counters()
	if err != nil {
		return nil, err
	}
	sb := &statsBuilder{b: b, c: c, now: b.clock.Now(), producers: map[string]*txmqv1.ProducerGroupStats{}}
	sb.resp = &txmqv1.GetStatsResponse{
		TakenAt:      timestamppb.New(sb.now),
		NodeId:       st.NodeID,
		Term:         st.Term,
		CommitIndex:  st.CommitIndex,
		AppliedIndex: st.AppliedIndex,
	}
	sb.countProducers()
	if err := b.node.Store().View(sb.read); err != nil {
		return nil, err
	}
	for _, p := range sb.producers {
		sb.resp.ProducerGroups = append(sb.resp.ProducerGroups, p)
	}
	sort.Slice(sb.resp.ProducerGroups, func(i, j int) bool {
		return sb.resp.ProducerGroups[i].ProducerGroup < sb.resp.ProducerGroups[j].ProducerGroup
	})
	return sb.resp, nil
}

// statsBuilder gathers one GetStats answer.
type statsBuilder struct {
	b         *Broker
	c         counterSnapshot
	now       time.Time
	resp      *txmqv1.GetStatsResponse
	producers map[string]*txmqv1.ProducerGroupStats
}

func (sb *statsBuilder) producer(name string) *txmqv1.ProducerGroupStats {
	p, ok := sb.producers[name]
	if !ok {
		p = &txmqv1.ProducerGroupStats{ProducerGroup: name}
		sb.producers[name] = p
	}
	return p
}

// countProducers takes the live instances and the leader's counters of
// resolutions and check-backs.
func (sb *statsBuilder) countProducers() {
	for _, in := range sb.b.checks.Registry().List("") {
		sb.producer(in.Group).Instances++
	}
	for _, r := range sb.c.samples("txmq_half_messages_resolved_total") {
		p := sb.producer(r.labels["group"])
		switch r.labels["state"] {
		case "committed":
			p.CommittedTotal += r.value
		case "rolled_back":
			p.RolledBackTotal += r.value
		case "expired":
			p.ExpiredTotal += r.value
		}
	}
	for _, call := range sb.c.samples("txmq_checkback_calls_total") {
		// no_instance is a check that found nobody to call.
		if call.labels["result"] == "no_instance" {
			continue
		}
		p := sb.producer(call.labels["group"])
		p.ChecksTotal += call.value
		switch call.labels["result"] {
		case "error", "timeout", "not_reached":
			p.CheckErrorsTotal += call.value
		}
	}
}

// read takes what is pending, expired and unconsumed from the store.
func (sb *statsBuilder) read(tx *halfstore.Tx) error {
	groups, err := readHalfGroups(tx, sb.now, nil)
	if err != nil {
		return err
	}
	for g, hg := range groups {
		p := sb.producer(g)
		p.Pending = uint64(hg.pending)
		p.Expired = uint64(hg.expired)
		if hg.oldest != 0 {
			p.OldestPendingAge = durationpb.New(max(sb.now.Sub(time.UnixMilli(hg.oldest)), 0))
		}
	}
	return eachGroup(tx, sb.addGroup)
}

func (sb *statsBuilder) addGroup(tp *storepb.Topic, g *storepb.Group, lag halfstore.GroupLag) {
	if g == nil {
		sb.resp.Topics = append(sb.resp.Topics, &txmqv1.TopicStats{Topic: tp.Name, Committed: tp.LastSequence})
		return
	}
	cg := &txmqv1.ConsumerGroupStats{
		Topic:         tp.Name,
		ConsumerGroup: g.Name,
		Lag:           lag.Lag,
		DeadLetters:   g.DeadLetters,
		Retrying:      g.Retrying,
	}
	if age := lagAge(sb.now, lag); age != nil {
		cg.LagAge = durationpb.New(*age)
	}
	cg.InFlight, cg.Subscribers = sb.b.DeliveryStats(tp.Name, g.Name)
	labels := map[string]string{"topic": tp.Name, "group": g.Name}
	cg.DeliveredTotal = sb.c.sum("txmq_messages_delivered_total", labels)
	cg.RedeliveredTotal = sb.c.sum("txmq_messages_redelivered_total", labels)
	cg.AckedTotal = sb.c.sum("txmq_messages_acked_total", labels)
	cg.DeadLetteredTotal = sb.c.sum("txmq_messages_dead_lettered_total", labels)
	sb.resp.ConsumerGroups = append(sb.resp.ConsumerGroups, cg)
}

// counterSnapshot is the broker's counters, gathered once.
type counterSnapshot map[string][]counterSample

type counterSample struct {
	labels map[string]string
	value  uint64
}

// counters gathers the registry's counters by metric name.
func (m *metrics) counters() (counterSnapshot, error) {
	fams, err := m.reg.Gather()
	if err != nil {
		return nil, err
	}
	out := counterSnapshot{}
	for _, f := range fams {
		if f.GetType() != dto.MetricType_COUNTER {
			continue
		}
		for _, mt := range f.Metric {
			labels := map[string]string{}
			for _, l := range mt.Label {
				labels[l.GetName()] = l.GetValue()
			}
			out[f.GetName()] = append(out[f.GetName()], counterSample{labels: labels, value: uint64(mt.GetCounter().GetValue())})
		}
	}
	return out, nil
}

func (c counterSnapshot) samples(name string) []counterSample { return c[name] }

// sum adds the samples of name whose labels include want.
func (c counterSnapshot) sum(name string, want map[string]string) uint64 {
	var n uint64
	for _, s := range c[name] {
		match := true
		for k, v := range want {
			match = match && s.labels[k] == v
		}
		if match {
			n += s.value
		}
	}
	return n
}
