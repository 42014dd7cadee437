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
		return nil, b.toStatus(err)
	}
	now := b.cfg.Now()
	resp := &txmqv1.GetStatsResponse{
		TakenAt:      timestamppb.New(now),
		NodeId:       st.NodeID,
		Term:         st.Term,
		CommitIndex:  st.CommitIndex,
		AppliedIndex: st.AppliedIndex,
	}
	c, err := b.metrics.counters()
	if err != nil {
		return nil, b.toStatus(err)
	}
	producers := map[string]*txmqv1.ProducerGroupStats{}
	pg := func(name string) *txmqv1.ProducerGroupStats {
		p, ok := producers[name]
		if !ok {
			p = &txmqv1.ProducerGroupStats{ProducerGroup: name}
			producers[name] = p
		}
		return p
	}
	for _, in := range b.checks.Registry().List("") {
		pg(in.Group).Instances++
	}
	for _, r := range c.samples("txmq_half_messages_resolved_total") {
		p := pg(r.labels["group"])
		switch r.labels["state"] {
		case "committed":
			p.CommittedTotal += r.value
		case "rolled_back":
			p.RolledBackTotal += r.value
		case "expired":
			p.ExpiredTotal += r.value
		}
	}
	for _, call := range c.samples("txmq_checkback_calls_total") {
		// no_instance is a check that found nobody to call.
		if call.labels["result"] == "no_instance" {
			continue
		}
		p := pg(call.labels["group"])
		p.ChecksTotal += call.value
		switch call.labels["result"] {
		case "error", "timeout", "not_reached":
			p.CheckErrorsTotal += call.value
		}
	}
	err = b.node.Store().View(func(tx *halfstore.Tx) error {
		pending, err := tx.PendingByGroup()
		if err != nil {
			return err
		}
		for g, n := range pending {
			p := pg(g)
			p.Pending = uint64(n)
			var oldest time.Time
			tx.PendingIDs(g, func(id string) {
				if t, ok := idTime(id); ok && (oldest.IsZero() || t.Before(oldest)) {
					oldest = t
				}
			})
			if !oldest.IsZero() {
				p.OldestPendingAge = durationpb.New(max(now.Sub(oldest), 0))
			}
		}
		expired, err := tx.ListHalf("", storepb.HalfState_HALF_STATE_EXPIRED, "", maxListAll)
		if err != nil {
			return err
		}
		for _, h := range expired {
			pg(h.ProducerGroup).Expired++
		}
		return eachGroup(tx, func(tp *storepb.Topic, g *storepb.Group, lag halfstore.GroupLag) {
			if g == nil {
				resp.Topics = append(resp.Topics, &txmqv1.TopicStats{Topic: tp.Name, Committed: tp.LastSequence})
				return
			}
			cg := &txmqv1.ConsumerGroupStats{
				Topic:         tp.Name,
				ConsumerGroup: g.Name,
				Lag:           lag.Lag,
				DeadLetters:   g.DeadLetters,
				Retrying:      g.Retrying,
			}
			if age := lagAge(now, lag); age != nil {
				cg.LagAge = durationpb.New(*age)
			}
			cg.InFlight, cg.Subscribers = b.DeliveryStats(tp.Name, g.Name)
			labels := map[string]string{"topic": tp.Name, "group": g.Name}
			cg.DeliveredTotal = c.sum("txmq_messages_delivered_total", labels)
			cg.RedeliveredTotal = c.sum("txmq_messages_redelivered_total", labels)
			cg.AckedTotal = c.sum("txmq_messages_acked_total", labels)
			cg.DeadLetteredTotal = c.sum("txmq_messages_dead_lettered_total", labels)
			resp.ConsumerGroups = append(resp.ConsumerGroups, cg)
		})
	})
	if err != nil {
		return nil, b.toStatus(err)
	}
	for _, p := range producers {
		resp.ProducerGroups = append(resp.ProducerGroups, p)
	}
	sort.Slice(resp.ProducerGroups, func(i, j int) bool {
		return resp.ProducerGroups[i].ProducerGroup < resp.ProducerGroups[j].ProducerGroup
	})
	return resp, nil
}

// maxListAll bounds the expired half messages one GetStats reads; expired
// ones wait for an operator, so there are few.
const maxListAll = 100000

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
