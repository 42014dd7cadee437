package broker

import (
	"context"
	"errors"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Creating consumer groups as an operator, and deleting topics and
// consumer groups. A deletion's dry run reads what it would drop on the
// leader; the deletion itself is one Raft command, applied to the topic or
// group as it is then, and answered with what it dropped.

func (s *adminService) DeleteTopic(ctx context.Context, req *txmqv1.DeleteTopicRequest) (*txmqv1.DeleteTopicResponse, error) {
	b := s.b
	if err := checkTopic(req.Name); err != nil {
		return nil, err
	}
	if req.DryRun {
		resp := &txmqv1.DeleteTopicResponse{DryRun: true}
		err := b.leaderView(func(tx *halfstore.Tx) error {
			t, err := tx.Topic(req.Name)
			if err != nil {
				return err
			}
			groups, err := tx.Groups(req.Name)
			if err != nil {
				return err
			}
			resp.Topic = topicToAPI(t, groups)
			if resp.ConsumerGroups, err = b.groupStatuses(tx, groups); err != nil {
				return err
			}
			open, err := tx.OpenHalves(req.Name)
			resp.PendingHalfMessages = uint64(open)
			return err
		})
		if err != nil {
			return nil, err
		}
		return resp, nil
	}
	r, err := b.node.DeleteTopic(ctx, b.clock.Now(), &raftpb.DeleteTopic{Name: req.Name})
	if err != nil {
		return nil, err
	}
	groups := make([]*storepb.Group, len(r.Groups))
	resp := &txmqv1.DeleteTopicResponse{}
	for i, g := range r.Groups {
		groups[i] = g.Group
		resp.ConsumerGroups = append(resp.ConsumerGroups, b.statusOf(g.Group, r.Topic, g.Lag))
	}
	resp.Topic = topicToAPI(r.Topic, groups)
	b.log.Info("topic deleted", "topic", req.Name, "messages", resp.Topic.Messages, "bytes", resp.Topic.Bytes, "consumer_groups", len(groups))
	return resp, nil
}

// groupStatuses is the status of each group.
func (b *Broker) groupStatuses(tx *halfstore.Tx, groups []*storepb.Group) ([]*txmqv1.GroupTopicStatus, error) {
	var out []*txmqv1.GroupTopicStatus
	for _, g := range groups {
		st, err := b.groupStatus(tx, g)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

func (s *adminService) CreateConsumerGroup(ctx context.Context, req *txmqv1.CreateConsumerGroupRequest) (*txmqv1.CreateConsumerGroupResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	if err := checkTopic(req.Topic); err != nil {
		return nil, err
	}
	earliest := raftpb.StartPosition_START_POSITION_EARLIEST
	pos, at, err := startPosition("start_position", req.StartPosition, req.StartTime, &earliest)
	if err != nil {
		return nil, err
	}
	r, err := b.node.CreateGroup(ctx, b.clock.Now(), &raftpb.CreateGroup{
		Topic: req.Topic, Group: req.ConsumerGroup, Start: pos, StartTime: at,
	})
	if err != nil {
		return nil, err
	}
	if r.Created {
		b.log.Info("consumer group created", "topic", req.Topic, "group", req.ConsumerGroup,
			"start", req.StartPosition.String(), "acked_through", r.Group.AckedThrough, "by", "operator")
	}
	resp := &txmqv1.CreateConsumerGroupResponse{Created: r.Created}
	err = b.node.Store().View(func(tx *halfstore.Tx) error {
		resp.Group, err = b.groupStatus(tx, r.Group)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminService) DeleteConsumerGroup(ctx context.Context, req *txmqv1.DeleteConsumerGroupRequest) (*txmqv1.DeleteConsumerGroupResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	if req.Topic != "" {
		if err := checkTopic(req.Topic); err != nil {
			return nil, err
		}
	}
	resp := &txmqv1.DeleteConsumerGroupResponse{ConsumerGroup: req.ConsumerGroup, DryRun: req.DryRun}
	if req.DryRun {
		err := b.leaderView(func(tx *halfstore.Tx) error {
			var groups []*storepb.Group
			if req.Topic != "" {
				g, err := tx.Group(req.Topic, req.ConsumerGroup)
				if err != nil {
					return err
				}
				groups = []*storepb.Group{g}
			} else {
				var err error
				if groups, err = tx.GroupTopics(req.ConsumerGroup); err != nil {
					return err
				}
				resp.Policy = tx.HasConsumerGroupPolicy(req.ConsumerGroup)
				if len(groups) == 0 && !resp.Policy {
					return &notFoundGroup{req.ConsumerGroup}
				}
			}
			var err error
			resp.Topics, err = b.groupStatuses(tx, groups)
			return err
		})
		if err != nil {
			return nil, err
		}
		return resp, nil
	}
	r, err := b.node.DeleteGroup(ctx, b.clock.Now(), &raftpb.DeleteGroup{Group: req.ConsumerGroup, Topic: req.Topic})
	if err != nil {
		return nil, err
	}
	resp.Policy = r.Policy
	if resp.Topics, err = b.droppedStatuses(r); err != nil {
		return nil, err
	}
	b.log.Info("consumer group deleted", "group", req.ConsumerGroup, "topic", req.Topic, "topics", len(r.Groups), "policy", r.Policy)
	return resp, nil
}

// droppedStatuses is the status of the groups a deletion dropped, as they
// were, against their topics as they are now.
func (b *Broker) droppedStatuses(r raftlog.DeleteResult) ([]*txmqv1.GroupTopicStatus, error) {
	out := make([]*txmqv1.GroupTopicStatus, len(r.Groups))
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		for i, g := range r.Groups {
			t, err := tx.Topic(g.Group.Topic)
			if err != nil && !errors.Is(err, halfstore.ErrNotFound) {
				return err
			}
			// A topic deleted meanwhile leaves its sequences unknown (t nil).
			out[i] = b.statusOf(g.Group, t, g.Lag)
		}
		return nil
	})
	return out, err
}
