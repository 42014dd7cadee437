package broker

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// The dead-letter queues as operators see them: list, show, redrive, purge.

func deadLetterOut(dl *storepb.DeadLetter, withBody bool) *txmqv1.DeadLetter {
	m := dl.Message
	out := &txmqv1.DeadLetter{
		ConsumerGroup: dl.Group,
		Topic:         dl.Topic,
		MessageId:     m.Id,
		Sequence:      m.Sequence,
		Attempts:      dl.Attempts,
		LastError:     dl.LastError,
		DeadAt:        ts(dl.DeadAt),
		CommittedAt:   ts(m.CommittedAt),
		Key:           m.Key,
		OrderingKey:   m.OrderingKey,
		Properties:    m.Properties,
		BodySize:      uint32(len(m.Body)),
		ProducerGroup: m.ProducerGroup,
		TransactionId: m.TransactionId,
	}
	if withBody {
		out.Body = m.Body
	}
	return out
}

const (
	defaultDLQPage = 100
	maxDLQPage     = 1000
)

// ListDeadLetters pages through a group's dead letters by (topic,
// sequence); the page token is "topic:sequence" of the last one returned.
func (s *adminService) ListDeadLetters(ctx context.Context, req *txmqv1.ListDeadLettersRequest) (*txmqv1.ListDeadLettersResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	if req.Topic != "" {
		if err := checkTopic(req.Topic); err != nil {
			return nil, err
		}
	}
	limit := int(req.Limit)
	switch {
	case limit == 0:
		limit = defaultDLQPage
	case limit > maxDLQPage:
		return nil, invalidf("limit %d is over %d", limit, maxDLQPage)
	}
	var afterTopic string
	var afterSeq uint64
	if req.PageToken != "" {
		t, seq, ok := strings.Cut(req.PageToken, ":")
		n, err := strconv.ParseUint(seq, 10, 64)
		if !ok || err != nil || checkTopic(t) != nil {
			return nil, invalidf("page_token %q is not one this broker returned", req.PageToken)
		}
		afterTopic, afterSeq = t, n
	}
	resp := &txmqv1.ListDeadLettersResponse{}
	err := b.leaderView(func(tx *halfstore.Tx) error {
		groups, err := groupsOn(tx, req.ConsumerGroup, req.Topic)
		if err != nil {
			return err
		}
		for _, g := range groups {
			if g.Topic < afterTopic {
				continue
			}
			var after uint64
			if g.Topic == afterTopic {
				after = afterSeq
			}
			page, err := tx.DeadLetters(g.Topic, g.Name, after, limit-len(resp.DeadLetters)+1)
			if err != nil {
				return err
			}
			for _, dl := range page {
				if len(resp.DeadLetters) == limit {
					last := resp.DeadLetters[limit-1]
					resp.NextPageToken = last.Topic + ":" + strconv.FormatUint(last.Sequence, 10)
					return nil
				}
				resp.DeadLetters = append(resp.DeadLetters, deadLetterOut(dl, false))
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminService) GetDeadLetter(ctx context.Context, req *txmqv1.GetDeadLetterRequest) (*txmqv1.GetDeadLetterResponse, error) {
	b := s.b
	if err := checkName("consumer_group", req.ConsumerGroup); err != nil {
		return nil, err
	}
	if req.MessageId == "" {
		return nil, invalidf("message_id is required")
	}
	var out *txmqv1.DeadLetter
	err := b.leaderView(func(tx *halfstore.Tx) error {
		dl, err := tx.DeadLetterByID(req.ConsumerGroup, req.MessageId)
		if err != nil {
			return err
		}
		out = deadLetterOut(dl, true)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &txmqv1.GetDeadLetterResponse{DeadLetter: out}, nil
}

func (s *adminService) RedriveDeadLetters(ctx context.Context, req *txmqv1.RedriveDeadLettersRequest) (*txmqv1.RedriveDeadLettersResponse, error) {
	n, err := s.b.dlqOp(ctx, "redrive", req.ConsumerGroup, req.Topic, req.MessageIds, req.All)
	if err != nil {
		return nil, err
	}
	return &txmqv1.RedriveDeadLettersResponse{Redriven: n}, nil
}

func (s *adminService) PurgeDeadLetters(ctx context.Context, req *txmqv1.PurgeDeadLettersRequest) (*txmqv1.PurgeDeadLettersResponse, error) {
	if req.DryRun {
		return s.b.purgePreview(req)
	}
	n, err := s.b.dlqOp(ctx, "purge", req.ConsumerGroup, req.Topic, req.MessageIds, req.All)
	if err != nil {
		return nil, err
	}
	return &txmqv1.PurgeDeadLettersResponse{Purged: n}, nil
}

// purgePreview is a purge's dry run: how many dead letters it would
// delete, and the first maxDLQPage of them, without bodies.
func (b *Broker) purgePreview(req *txmqv1.PurgeDeadLettersRequest) (*txmqv1.PurgeDeadLettersResponse, error) {
	if err := checkDLQRequest("purge", req.ConsumerGroup, req.Topic, req.MessageIds, req.All); err != nil {
		return nil, err
	}
	resp := &txmqv1.PurgeDeadLettersResponse{DryRun: true}
	err := b.leaderView(func(tx *halfstore.Tx) error {
		sel, err := selectDead(tx, req.ConsumerGroup, req.Topic, req.MessageIds, req.All)
		if err != nil {
			return err
		}
		listed := sel.named
		for _, t := range sel.topics {
			resp.Purged += sel.atStart[t]
			if room := maxDLQPage - len(listed); req.All && room > 0 {
				page, err := tx.DeadLetters(t, req.ConsumerGroup, 0, room)
				if err != nil {
					return err
				}
				listed = append(listed, page...)
			}
		}
		for _, dl := range listed {
			resp.DeadLetters = append(resp.DeadLetters, deadLetterOut(dl, false))
		}
		if !req.All {
			resp.Purged = uint64(len(listed))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// checkDLQRequest checks the selection of a redrive or purge: message IDs
// or all, not both.
func checkDLQRequest(verb, group, topic string, ids []string, all bool) error {
	if err := checkName("consumer_group", group); err != nil {
		return err
	}
	if topic != "" {
		if err := checkTopic(topic); err != nil {
			return err
		}
	}
	switch {
	case all && len(ids) > 0:
		return invalidf("give message_ids or all, not both")
	case !all && len(ids) == 0:
		return invalidf("give the message_ids to %s, or all", verb)
	case len(ids) > maxDLQPage:
		return invalidf("%d message_ids, over the limit of %d per call", len(ids), maxDLQPage)
	}
	return nil
}

// deadSelection is what a redrive or purge acts on, topic by topic: the
// named dead letters, or with all every one there was when the call came
// (atStart), so that messages that fail again meanwhile do not keep it
// going.
type deadSelection struct {
	topics  []string
	bySeq   map[string][]uint64
	atStart map[string]uint64
	named   []*storepb.DeadLetter
}

// selectDead finds the dead letters a redrive or purge acts on; every
// named one must be in the DLQ (of topic, when given).
func selectDead(tx *halfstore.Tx, group, topic string, ids []string, all bool) (*deadSelection, error) {
	sel := &deadSelection{bySeq: map[string][]uint64{}, atStart: map[string]uint64{}}
	if all {
		groups, err := groupsOn(tx, group, topic)
		for _, g := range groups {
			sel.topics = append(sel.topics, g.Topic)
			sel.atStart[g.Topic] = g.DeadLetters
		}
		return sel, err
	}
	for _, id := range ids {
		dl, err := tx.DeadLetterByID(group, id)
		if err != nil {
			return nil, fmt.Errorf("message %s is not in the dead-letter queue of group %s: %w", id, group, err)
		}
		if topic != "" && dl.Topic != topic {
			return nil, fmt.Errorf("message %s is a dead letter of topic %s, not %s: %w", id, dl.Topic, topic, halfstore.ErrNotFound)
		}
		if _, ok := sel.bySeq[dl.Topic]; !ok {
			sel.topics = append(sel.topics, dl.Topic)
		}
		sel.bySeq[dl.Topic] = append(sel.bySeq[dl.Topic], dl.Message.Sequence)
		sel.named = append(sel.named, dl)
	}
	return sel, nil
}

// dlqOp redrives or purges dead letters: the named ones (all must be in
// the DLQ, or nothing changes), or with all every one, in bounded batches.
func (b *Broker) dlqOp(ctx context.Context, verb, group, topic string, ids []string, all bool) (uint64, error) {
	if err := checkDLQRequest(verb, group, topic, ids, all); err != nil {
		return 0, err
	}
	var sel *deadSelection
	err := b.leaderView(func(tx *halfstore.Tx) error {
		var err error
		sel, err = selectDead(tx, group, topic, ids, all)
		return err
	})
	if err != nil {
		return 0, err
	}
	var total uint64
	for _, t := range sel.topics {
		var done uint64
		for {
			var r raftlog.DeadLettersResult
			var err error
			if verb == "redrive" {
				r, err = b.node.Redrive(ctx, b.clock.Now(), &raftpb.Redrive{Topic: t, Group: group, Sequences: sel.bySeq[t], All: all, Limit: maxDLQPage})
			} else {
				r, err = b.node.PurgeDeadLetters(ctx, b.clock.Now(), &raftpb.PurgeDeadLetters{Topic: t, Group: group, Sequences: sel.bySeq[t], All: all, Limit: maxDLQPage})
			}
			if err != nil {
				return total, err
			}
			n := uint64(len(r.Moved) + r.Purged)
			total += n
			done += n
			if !all || n == 0 || done >= sel.atStart[t] {
				break
			}
		}
	}
	b.log.Info("dead letters "+verb+"d", "group", group, "topic", topic, "count", total, "all", all)
	return total, nil
}
