package broker

import (
	"context"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/bounds"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Consumer groups as operators see them: progress and lag per topic, the
// delivery policy, position resets and the dead-letter queue. Reads are
// served by the leader (in-flight counts and subscribers live there).

func (s *adminService) DescribeConsumerGroup(ctx context.Context, req *txmqv1.DescribeConsumerGroupRequest) (*txmqv1.DescribeConsumerGroupResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	var resp *txmqv1.DescribeConsumerGroupResponse
	err := b.leaderView(func(tx *halfstore.Tx) error {
		groups, err := tx.GroupTopics(req.ConsumerGroup)
		if err != nil {
			return err
		}
		if len(groups) == 0 {
			return &notFoundGroup{req.ConsumerGroup}
		}
		resp, err = b.describeGroup(tx, req.ConsumerGroup, groups)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminService) ListConsumerGroups(ctx context.Context, req *txmqv1.ListConsumerGroupsRequest) (*txmqv1.ListConsumerGroupsResponse, error) {
	b := s.b
	if req.Topic != "" {
		if err := checkTopic(req.Topic); err != nil {
			return nil, err
		}
	}
	resp := &txmqv1.ListConsumerGroupsResponse{}
	err := b.leaderView(func(tx *halfstore.Tx) error {
		var topics []*storepb.Topic
		if req.Topic != "" {
			t, err := tx.Topic(req.Topic)
			if err != nil {
				return err
			}
			topics = []*storepb.Topic{t}
		} else {
			var err error
			if topics, err = tx.Topics(); err != nil {
				return err
			}
		}
		byGroup := map[string][]*storepb.Group{}
		var names []string
		for _, t := range topics {
			groups, err := tx.Groups(t.Name)
			if err != nil {
				return err
			}
			for _, g := range groups {
				if _, ok := byGroup[g.Name]; !ok {
					names = append(names, g.Name)
				}
				byGroup[g.Name] = append(byGroup[g.Name], g)
			}
		}
		slices.Sort(names)
		for _, name := range names {
			if req.Unused {
				// Whether it is unused depends on all of its topics.
				all, err := tx.GroupTopics(name)
				if err != nil {
					return err
				}
				byGroup[name] = all
			}
			d, err := b.describeGroup(tx, name, byGroup[name])
			if err != nil {
				return err
			}
			if !req.Unused || unused(d) {
				resp.Groups = append(resp.Groups, d)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// describeGroup is a group's status on the given topics, with its policy
// and its subscribers.
func (b *Broker) describeGroup(tx *halfstore.Tx, name string, groups []*storepb.Group) (*txmqv1.DescribeConsumerGroupResponse, error) {
	pol, err := b.groupPolicy(tx, name)
	if err != nil {
		return nil, err
	}
	resp := &txmqv1.DescribeConsumerGroupResponse{ConsumerGroup: name, Config: policyOut(name, pol)}
	for _, g := range groups {
		st, err := b.groupStatus(tx, g)
		if err != nil {
			return nil, err
		}
		resp.Topics = append(resp.Topics, st)
		resp.Members = append(resp.Members, b.members(g.Topic, g.Name)...)
	}
	return resp, nil
}

// groupStatus is a group's progress on its topic, with its lag and, on the
// leader, its deliveries in flight and subscribers.
func (b *Broker) groupStatus(tx *halfstore.Tx, g *storepb.Group) (*txmqv1.GroupTopicStatus, error) {
	t, err := tx.Topic(g.Topic)
	if err != nil {
		return nil, err
	}
	lag, err := tx.Lag(g.Topic, g.Name)
	if err != nil {
		return nil, err
	}
	st := b.statusOf(g, t, lag)
	st.InFlight, st.Subscribers = b.DeliveryStats(g.Topic, g.Name)
	return st, nil
}

// statusOf is a group's progress on topic t (nil: unknown) with its lag.
func (b *Broker) statusOf(g *storepb.Group, t *storepb.Topic, lag halfstore.GroupLag) *txmqv1.GroupTopicStatus {
	st := &txmqv1.GroupTopicStatus{
		ConsumerGroup: g.Name,
		Topic:         g.Topic,
		AckedThrough:  g.AckedThrough,
		AckedAbove:    g.AckedAbove,
		LastSequence:  t.GetLastSequence(),
		FirstSequence: t.GetFirstSequence(),
		Lag:           lag.Lag,
		CreatedAt:     ts(g.CreatedAt),
		Redeliveries:  g.Redeliveries,
		Retrying:      g.Retrying,
		DeadLetters:   g.DeadLetters,
		Dropped:       g.Dropped,
		AutoCreated:   g.AutoCreated,
	}
	if age := lagAge(b.clock.Now(), lag); age != nil {
		st.OldestUnackedAt = ts(lag.OldestUnacked)
		st.LagAge = durationpb.New(*age)
	}
	return st
}

// unused reports whether a group was created by subscriptions on each of
// its topics and has no subscriber on any now.
func unused(d *txmqv1.DescribeConsumerGroupResponse) bool {
	for _, t := range d.Topics {
		if !t.AutoCreated || t.Subscribers > 0 {
			return false
		}
	}
	return true
}

// lagAge is how long a group's oldest unacked message has waited, nil
// when it has none: what describe, stats and /metrics show as lag age.
func lagAge(now time.Time, lag halfstore.GroupLag) *time.Duration {
	if lag.OldestUnacked == 0 {
		return nil
	}
	age := max(now.Sub(time.Unix(0, lag.OldestUnacked)), 0)
	return &age
}

// eachGroup calls f with every topic, and with each of its consumer groups
// and that group's lag (g nil once per topic, before its groups).
func eachGroup(tx *halfstore.Tx, f func(tp *storepb.Topic, g *storepb.Group, lag halfstore.GroupLag)) error {
	topics, err := tx.Topics()
	if err != nil {
		return err
	}
	for _, tp := range topics {
		f(tp, nil, halfstore.GroupLag{})
		groups, err := tx.Groups(tp.Name)
		if err != nil {
			return err
		}
		for _, g := range groups {
			lag, err := tx.Lag(tp.Name, g.Name)
			if err != nil {
				return err
			}
			f(tp, g, lag)
		}
	}
	return nil
}

func policyOut(group string, p policy) *txmqv1.ConsumerGroupConfig {
	maxDeliveries := p.maxDeliveries
	out := &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: group,
		MaxDeliveries: &maxDeliveries,
		AckDeadline:   durationpb.New(p.ackDeadline),
		OrderedPoison: txmqv1.OrderedPoison_ORDERED_POISON_SKIP,
	}
	if p.hold {
		out.OrderedPoison = txmqv1.OrderedPoison_ORDERED_POISON_HOLD
	}
	for _, d := range p.backoff {
		out.RedeliveryBackoff = append(out.RedeliveryBackoff, durationpb.New(d))
	}
	return out
}

func (s *adminService) GetConsumerGroupConfig(ctx context.Context, req *txmqv1.GetConsumerGroupConfigRequest) (*txmqv1.GetConsumerGroupConfigResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	var out *txmqv1.ConsumerGroupConfig
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		p, err := b.groupPolicy(tx, req.ConsumerGroup)
		out = policyOut(req.ConsumerGroup, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &txmqv1.GetConsumerGroupConfigResponse{Config: out}, nil
}

// SetConsumerGroupConfig changes the fields that are set; the state
// machine merges them into the stored policy, so concurrent changes of
// different fields all take effect. A group's policy can be set before
// the group has subscribed anywhere.
func (s *adminService) SetConsumerGroupConfig(ctx context.Context, req *txmqv1.SetConsumerGroupConfigRequest) (*txmqv1.SetConsumerGroupConfigResponse, error) {
	b := s.b
	c := req.Config
	if c == nil {
		return nil, invalidf("config is required")
	}
	if err := checkName("consumer_group", c.ConsumerGroup); err != nil {
		return nil, err
	}
	op := &raftpb.UpdateConsumerGroup{Name: c.ConsumerGroup}
	if c.MaxDeliveries != nil {
		if err := bounds.MaxDeliveries.Check("max_deliveries", *c.MaxDeliveries); err != nil {
			return nil, invalidf("%v", err)
		}
		op.MaxDeliveries = c.MaxDeliveries
	}
	var err error
	if op.AckDeadline, err = optNanos("ack_deadline", c.AckDeadline, bounds.AckDeadline); err != nil {
		return nil, err
	}
	if len(c.RedeliveryBackoff) > 0 {
		steps := make([]time.Duration, len(c.RedeliveryBackoff))
		op.RedeliveryBackoff = &raftpb.Backoff{}
		for i, d := range c.RedeliveryBackoff {
			if d == nil || d.CheckValid() != nil {
				return nil, invalidf("redelivery_backoff step %d is not a valid duration", i+1)
			}
			steps[i] = d.AsDuration()
			op.RedeliveryBackoff.Steps = append(op.RedeliveryBackoff.Steps, int64(steps[i]))
		}
		if err := checkBackoff(steps); err != nil {
			return nil, invalidf("redelivery_backoff: %v", err)
		}
	}
	if op.OrderedPoison, err = orderedPoison(c.OrderedPoison); err != nil {
		return nil, err
	}
	r, err := b.node.UpdateConsumerGroup(ctx, b.clock.Now(), op)
	if err != nil {
		return nil, err
	}
	p := r.Policy
	b.log.Info("consumer group policy set", "group", c.ConsumerGroup, "max_deliveries", p.MaxDeliveries,
		"ack_deadline", time.Duration(p.AckDeadline), "backoff_steps", len(p.RedeliveryBackoff), "ordered_poison", p.OrderedPoison.String())
	got, err := s.GetConsumerGroupConfig(ctx, &txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: c.ConsumerGroup})
	if err != nil {
		return nil, err
	}
	return &txmqv1.SetConsumerGroupConfigResponse{Config: got.Config}, nil
}

func (s *adminService) ResetConsumerGroup(ctx context.Context, req *txmqv1.ResetConsumerGroupRequest) (*txmqv1.ResetConsumerGroupResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	if req.Topic != "" {
		if err := checkTopic(req.Topic); err != nil {
			return nil, err
		}
	}
	pos, at, err := startPosition("to", req.To, req.Time, nil)
	if err != nil {
		return nil, err
	}
	start := raftlog.GroupStart(pos, at)
	resp := &txmqv1.ResetConsumerGroupResponse{DryRun: req.DryRun}
	err = b.leaderView(func(tx *halfstore.Tx) error {
		groups, err := groupsOn(tx, req.ConsumerGroup, req.Topic)
		if err != nil {
			return err
		}
		for _, g := range groups {
			lag, err := tx.Lag(g.Topic, g.Name)
			if err != nil {
				return err
			}
			first, err := tx.StartSeq(g.Topic, start)
			if err != nil {
				return err
			}
			t, err := tx.Topic(g.Topic)
			if err != nil {
				return err
			}
			r := &txmqv1.GroupReset{Topic: g.Topic, OldAckedThrough: g.AckedThrough, NewAckedThrough: first - 1, LagBefore: lag.Lag}
			// After the reset: the retained log from the new position on,
			// plus the redriven dead letters at or before it (kept).
			from := max(first, t.FirstSequence)
			if t.LastSequence >= from {
				r.LagAfter = t.LastSequence - from + 1
			}
			kept, err := redrivenThrough(tx, g, first-1)
			if err != nil {
				return err
			}
			r.LagAfter += kept
			resp.Topics = append(resp.Topics, r)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if req.DryRun {
		return resp, nil
	}
	for _, r := range resp.Topics {
		if _, err := b.node.ResetGroup(ctx, b.clock.Now(), &raftpb.ResetGroup{
			Topic: r.Topic, Group: req.ConsumerGroup, To: pos, Time: at,
		}); err != nil {
			return nil, err
		}
		b.log.Info("consumer group reset", "group", req.ConsumerGroup, "topic", r.Topic,
			"old_acked_through", r.OldAckedThrough, "new_acked_through", r.NewAckedThrough, "to", req.To.String())
	}
	return resp, nil
}

// redrivenThrough counts a group's redriven dead letters at or below seq.
func redrivenThrough(tx *halfstore.Tx, g *storepb.Group, seq uint64) (uint64, error) {
	var n uint64
	var from uint64
	for {
		page, err := tx.ReadRedriven(g.Topic, g.Name, from, 1000)
		if err != nil {
			return 0, err
		}
		for _, dl := range page {
			if dl.Message.Sequence > seq {
				return n, nil
			}
			n++
			from = dl.Message.Sequence + 1
		}
		if len(page) < 1000 {
			return n, nil
		}
	}
}

// groupsOn is a group's progress on one topic, or on all of its topics.
func groupsOn(tx *halfstore.Tx, group, topic string) ([]*storepb.Group, error) {
	if topic != "" {
		g, err := tx.Group(topic, group)
		if err != nil {
			return nil, err
		}
		return []*storepb.Group{g}, nil
	}
	groups, err := tx.GroupTopics(group)
	if err != nil {
		return nil, err
	}
	if len(groups) == 0 {
		return nil, &notFoundGroup{group}
	}
	return groups, nil
}
