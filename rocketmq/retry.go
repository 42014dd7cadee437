package rocketmq

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Retries. A message a consumer gives back (CONSUMER_SEND_MSG_BACK) is
// copied into its group's retry topic, which RocketMQ clients know as
// %RETRY%group and txmq stores as the broker's own topic
// txmq.retry.<group>; the copy is held back until its delay level's time.
// After maxReconsumeTimes (or with delay level -1) it goes to txmq's
// dead-letter queue of the group instead (brokerctl dlq).

const (
	retryPrefix      = "%RETRY%"
	dlqPrefix        = "%DLQ%"
	storeRetryPrefix = "txmq.retry."

	// propDeliverAt holds a retry copy back until this Unix millisecond.
	propDeliverAt   = "TXMQ_DELIVER_AT"
	propRetryTopic  = "RETRY_TOPIC"
	propOriginMsgID = "ORIGIN_MESSAGE_ID"
	propDelay       = "DELAY"

	// retryOffsetBit marks the commit-log offset of a message of a retry
	// topic: a consumer sends it back naming the original topic.
	retryOffsetBit = 1 << 40
)

// delayLevels are RocketMQ's default messageDelayLevel.
var delayLevels = []time.Duration{
	time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 3 * time.Minute, 4 * time.Minute, 5 * time.Minute, 6 * time.Minute,
	7 * time.Minute, 8 * time.Minute, 9 * time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour,
}

func delayOf(level int) time.Duration {
	return delayLevels[min(max(level, 1), len(delayLevels))-1]
}

// storeTopic is the txmq topic behind a RocketMQ topic name; ok is false
// for one txmq keeps no log of (%DLQ%group: dead letters are in txmq's DLQ).
func storeTopic(topic string) (name string, ok bool) {
	switch {
	case strings.HasPrefix(topic, retryPrefix):
		return storeRetryPrefix + strings.TrimPrefix(topic, retryPrefix), true
	case strings.HasPrefix(topic, dlqPrefix):
		return "", false
	}
	return topic, true
}

func isRetryTopic(topic string) bool { return strings.HasPrefix(topic, retryPrefix) }

// sendBackHeader is a CONSUMER_SEND_MSG_BACK header.
type sendBackHeader struct {
	group, originTopic string
	offset             int64
	delayLevel         int64
	maxReconsume       int64
}

func parseSendBack(req *command) (h sendBackHeader, err error) {
	h.group, h.originTopic = req.field("group"), req.field("originTopic")
	if h.offset, err = req.intField(-1, "offset"); err != nil {
		return h, err
	}
	if h.delayLevel, err = req.intField(0, "delayLevel"); err != nil {
		return h, err
	}
	if h.maxReconsume, err = req.intField(16, "maxReconsumeTimes"); err != nil {
		return h, err
	}
	if h.group == "" || h.originTopic == "" || h.offset < 0 {
		return h, fmt.Errorf("send-back needs group, originTopic and offset")
	}
	return h, nil
}

// sendBack answers CONSUMER_SEND_MSG_BACK.
func (s *Server) sendBack(req *command) *command {
	h, err := parseSendBack(req)
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	topic, seq := h.originTopic, uint64(h.offset)
	if h.offset&retryOffsetBit != 0 {
		topic, seq = storeRetryPrefix+h.group, uint64(h.offset&^retryOffsetBit)
	}
	var m *storepb.Message
	err = s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		m, err = tx.Message(topic, seq)
		return err
	})
	if err != nil {
		return fail(codeSystemError, fmt.Sprintf("the message at %s/%d: %v", topic, seq, err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	times, _ := strconv.Atoi(m.Properties[propReconsumeTimes])
	if h.delayLevel < 0 || int64(times) >= h.maxReconsume {
		return s.deadLetter(ctx, topic, h.group, seq, times+1)
	}
	level := int(h.delayLevel)
	if level == 0 {
		level = 3 + times
	}
	props := make(map[string]string, len(m.Properties)+4)
	for k, v := range m.Properties {
		props[k] = v
	}
	if props[propRetryTopic] == "" {
		props[propRetryTopic] = h.originTopic
	}
	if props[propOriginMsgID] == "" {
		props[propOriginMsgID] = props[propUniqKey]
	}
	props[propReconsumeTimes] = strconv.Itoa(times + 1)
	props[propDeliverAt] = strconv.FormatInt(s.cfg.Broker.Now().Add(delayOf(level)).UnixMilli(), 10)
	delete(props, propUniqKey) // a new message, with its own ID
	if _, err := s.cfg.Broker.SendReserved(ctx, &txmqv1.SendRequest{
		Topic: storeRetryPrefix + h.group, Properties: props, Body: m.Body,
	}); err != nil {
		return s.refusal(err)
	}
	return ok(nil, nil)
}

// deadLetter moves a message to txmq's dead-letter queue of the group, as
// the failure that used up its deliveries; txmq marks it acked.
func (s *Server) deadLetter(ctx context.Context, topic, group string, seq uint64, attempts int) *command {
	s.ensureGroup(topic, group, "CONSUME_FROM_FIRST_OFFSET")
	_, err := s.cfg.Broker.Node().RecordFailures(ctx, s.cfg.Broker.Now(), &raftpb.RecordFailures{
		Topic: topic, Group: group,
		Failures: []*raftpb.Failure{{
			Sequence: seq, Attempts: uint32(attempts), Dead: true,
			Error: fmt.Sprintf("RocketMQ consumer gave it back %d times (RECONSUME_LATER)", attempts),
		}},
	})
	if err != nil {
		return s.refusal(err)
	}
	s.log.Info("message dead-lettered", "topic", topic, "group", group, "seq", seq, "attempts", attempts)
	return ok(nil, nil)
}

// dueAt is when a message may be delivered: a retry copy's delay.
func dueAt(m *storepb.Message) (time.Time, bool) {
	v, ok := m.Properties[propDeliverAt]
	if !ok {
		return time.Time{}, false
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}
