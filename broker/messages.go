package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Reads of committed messages for operators (brokerctl msg get, msg find,
// consume --peek): leader reads, without a consumer group and without acks.
// There is no index by message ID or key: lookups scan, bounded.

const (
	// idWindow is how far from the time in its ID (ids.go) a message's
	// commit time is looked for: a plain message is committed at the time
	// its ID carries; the window covers the leader clocks of a leader
	// change.
	idWindow = 2 * time.Second
	// findBudget bounds the messages one FindMessages call reads; the
	// page token goes on from where it stopped.
	findBudget = 10000
	// readBodyBytes: a ReadMessages response stops after this much body.
	readBodyBytes = 1 << 20
)

func topicMessageToAPI(topic string, m *storepb.Message) *txmqv1.TopicMessage {
	return &txmqv1.TopicMessage{
		MessageId:     m.Id,
		Topic:         topic,
		Sequence:      m.Sequence,
		Key:           m.Key,
		OrderingKey:   m.OrderingKey,
		Properties:    m.Properties,
		Body:          m.Body,
		BodySize:      uint32(len(m.Body)),
		CommittedAt:   ts(m.CommittedAt),
		ProducerGroup: m.ProducerGroup,
		TransactionId: m.TransactionId,
	}
}

func (s *adminService) GetMessage(ctx context.Context, req *txmqv1.GetMessageRequest) (*txmqv1.GetMessageResponse, error) {
	byID := req.MessageId != ""
	switch {
	case byID && req.Sequence != 0:
		return nil, invalidf("give message_id, or topic and sequence, not both")
	case byID:
		if err := checkMessageID(req.MessageId); err != nil {
			return nil, err
		}
	case req.Topic == "":
		return nil, invalidf("name the message by topic and sequence, or by message_id")
	case req.Sequence == 0:
		return nil, invalidf("sequence is required with topic: sequences start at 1")
	}
	if req.Topic != "" {
		if err := checkName("topic", req.Topic); err != nil {
			return nil, err
		}
	}
	resp := &txmqv1.GetMessageResponse{}
	err := s.b.leaderView(func(tx *halfstore.Tx) error {
		var (
			topic = req.Topic
			m     *storepb.Message
			err   error
		)
		if byID {
			topic, m, err = messageByID(tx, req.Topic, req.MessageId)
		} else {
			m, err = messageAt(tx, req.Topic, req.Sequence)
		}
		if err == nil {
			resp.Message = topicMessageToAPI(topic, m)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// messageAt reads a message by sequence, saying which sequences the topic
// retains when it is not one of them.
func messageAt(tx *halfstore.Tx, topic string, seq uint64) (*storepb.Message, error) {
	tp, err := tx.Topic(topic)
	if err != nil {
		return nil, err
	}
	switch {
	case tp.LastSequence < tp.FirstSequence:
		return nil, fmt.Errorf("%w: topic %s has no message %d: it retains none", halfstore.ErrNotFound, topic, seq)
	case seq < tp.FirstSequence || seq > tp.LastSequence:
		return nil, fmt.Errorf("%w: topic %s has no message %d: it retains sequences %d to %d", halfstore.ErrNotFound, topic, seq, tp.FirstSequence, tp.LastSequence)
	}
	return tx.Message(topic, seq)
}

// messageByID finds a committed message by ID, in topic (every topic when
// ""). A half message's record says where it was committed; a plain
// message is looked for among the messages committed around the time its
// ID carries.
func messageByID(tx *halfstore.Tx, topic, id string) (string, *storepb.Message, error) {
	topics, err := topicNames(tx, topic)
	if err != nil {
		return "", nil, err
	}
	h, err := tx.Half(id)
	switch {
	case err == nil && h.State != storepb.HalfState_HALF_STATE_COMMITTED:
		return "", nil, fmt.Errorf("%w: %s is a half message in state %s, not a committed message (brokerctl half show %s)", halfstore.ErrNotFound, id, halfstore.StateName(h.State), id)
	case err == nil && (topic == "" || topic == h.Topic):
		m, err := messageAt(tx, h.Topic, h.Sequence)
		return h.Topic, m, err
	case err != nil && !errors.Is(err, halfstore.ErrNotFound):
		return "", nil, err
	}
	at, _ := idTime(id)
	from, to := at.Add(-idWindow).UnixNano(), at.Add(idWindow).UnixNano()
	for _, tp := range topics {
		m, err := tx.MessageInWindow(tp, id, from, to)
		if err == nil {
			return tp, m, nil
		}
		if !errors.Is(err, halfstore.ErrNotFound) {
			return "", nil, err
		}
	}
	where := "any topic"
	if topic != "" {
		where = "topic " + topic
	}
	return "", nil, fmt.Errorf("%w: no committed message %s in %s (never committed, or dropped by retention)", halfstore.ErrNotFound, id, where)
}

func (s *adminService) FindMessages(ctx context.Context, req *txmqv1.FindMessagesRequest) (*txmqv1.FindMessagesResponse, error) {
	switch {
	case req.Key == "":
		return nil, invalidf("key is required")
	case len(req.Key) > maxKeyLen:
		return nil, invalidf("key is %d bytes, over the limit of %d", len(req.Key), maxKeyLen)
	}
	if req.Topic != "" {
		if err := checkName("topic", req.Topic); err != nil {
			return nil, err
		}
	}
	start, from, err := findToken(req.PageToken)
	if err != nil {
		return nil, err
	}
	limit := listLimit(req.Limit)
	resp := &txmqv1.FindMessagesResponse{}
	err = s.b.leaderView(func(tx *halfstore.Tx) error {
		topics, err := topicNames(tx, req.Topic)
		if err != nil {
			return err
		}
		budget := findBudget
		for _, topic := range topics {
			if topic < start {
				continue
			}
			seq := uint64(1)
			if topic == start {
				seq = from
			}
			scan, err := tx.KeyMessages(topic, req.Key, seq, limit-len(resp.Messages), budget)
			if err != nil {
				return err
			}
			for _, m := range scan.Found {
				tm := topicMessageToAPI(topic, m)
				tm.Body = nil
				resp.Messages = append(resp.Messages, tm)
			}
			budget -= scan.Read
			if scan.Next != 0 {
				resp.NextPageToken = fmt.Sprintf("%s:%d", topic, scan.Next)
				return nil
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// topicNames is topic when set (NotFound if there is none), else every
// topic, in name order.
func topicNames(tx *halfstore.Tx, topic string) ([]string, error) {
	if topic != "" {
		_, err := tx.Topic(topic)
		return []string{topic}, err
	}
	all, err := tx.Topics()
	names := make([]string, len(all))
	for i, tp := range all {
		names[i] = tp.Name
	}
	return names, err
}

// findToken reads a FindMessages page token, "topic:sequence"; "" is the
// start.
func findToken(token string) (string, uint64, error) {
	if token == "" {
		return "", 1, nil
	}
	topic, seq, ok := strings.Cut(token, ":")
	n, err := strconv.ParseUint(seq, 10, 64)
	if !ok || err != nil || n == 0 || checkName("topic", topic) != nil {
		return "", 0, invalidf("page_token %q is not one this broker returned", token)
	}
	return topic, n, nil
}

func (s *adminService) ReadMessages(ctx context.Context, req *txmqv1.ReadMessagesRequest) (*txmqv1.ReadMessagesResponse, error) {
	if err := checkName("topic", req.Topic); err != nil {
		return nil, err
	}
	var start halfstore.GroupStart
	if req.FromSequence != 0 {
		if req.StartPosition != txmqv1.StartPosition_START_POSITION_UNSPECIFIED || req.StartTime != nil {
			return nil, invalidf("give from_sequence or start_position, not both")
		}
	} else {
		earliest := raftpb.StartPosition_START_POSITION_EARLIEST
		pos, at, err := startPosition("start_position", req.StartPosition, req.StartTime, &earliest)
		if err != nil {
			return nil, err
		}
		start = raftlog.GroupStart(pos, at)
	}
	limit := listLimit(req.Limit)
	resp := &txmqv1.ReadMessagesResponse{NextSequence: req.FromSequence}
	err := s.b.leaderView(func(tx *halfstore.Tx) error {
		if resp.NextSequence == 0 {
			var err error
			if resp.NextSequence, err = tx.StartSeq(req.Topic, start); err != nil {
				return err
			}
		}
		msgs, err := tx.ReadTopic(req.Topic, resp.NextSequence, limit)
		if err != nil {
			return err
		}
		size := 0
		for _, m := range msgs {
			if size >= readBodyBytes {
				break
			}
			size += len(m.Body)
			resp.Messages = append(resp.Messages, topicMessageToAPI(req.Topic, m))
			resp.NextSequence = m.Sequence + 1
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}
