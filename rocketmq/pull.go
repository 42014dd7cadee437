package rocketmq

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

// PULL_MESSAGE sysFlag bits.
const (
	pullCommitOffset = 0x1
	pullSuspend      = 0x2
)

// maxPullBatch and maxPullBytes bound one PULL_MESSAGE answer (it holds
// at least one message).
const (
	maxPullBatch = 64
	maxPullBytes = 4 << 20
)

// pullRequest is a parsed PULL_MESSAGE header.
type pullRequest struct {
	topic, group string
	queue        int
	offset       int64
	max          int
	sysFlag      int64
	commit       int64
	wait         time.Duration
	tags         tagFilter
}

func (s *Server) parsePull(req *command) (pullRequest, error) {
	p := pullRequest{topic: req.field("topic"), group: req.field("consumerGroup"), tags: parseTags(req.field("subscription"))}
	var err error
	if p.queue, err = s.queueOf(req); err != nil {
		return p, err
	}
	n, err := req.intField(32, "maxMsgNums")
	if err != nil {
		return p, err
	}
	p.max = int(min(max(n, 1), maxPullBatch))
	if p.offset, err = req.intField(0, "queueOffset"); err != nil {
		return p, err
	}
	if p.sysFlag, err = req.intField(0, "sysFlag"); err != nil {
		return p, err
	}
	if p.commit, err = req.intField(0, "commitOffset"); err != nil {
		return p, err
	}
	ms, err := req.intField(0, "suspendTimeoutMillis")
	if err != nil {
		return p, err
	}
	if p.sysFlag&pullSuspend != 0 {
		p.wait = min(time.Duration(ms)*time.Millisecond, s.cfg.MaxPollWait)
	}
	return p, nil
}

// pull answers PULL_MESSAGE: messages of one queue from an offset, after
// waiting up to the request's suspend time for one to come (long polling).
func (s *Server) pull(c *conn, req *command) *command {
	p, err := s.parsePull(req)
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	if !s.cfg.Broker.Node().IsLeader() {
		return fail(codeServiceUnavailable, "this txmq node is not the leader")
	}
	if p.sysFlag&pullCommitOffset != 0 && p.commit > 0 {
		if err := s.commit(p.topic, p.group, p.queue, p.commit); err != nil {
			s.log.Warn("offset commit with a pull failed", "topic", p.topic, "group", p.group, "err", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.wait)
	defer cancel()
	name, _ := storeTopic(p.topic)
	for {
		appended := s.cfg.Broker.Appended(name)
		resp, due, found, err := s.read(p)
		if err != nil {
			return fail(codeSystemError, err.Error())
		}
		if found {
			return resp
		}
		if !c.wait(ctx, appended, due) {
			return resp
		}
	}
}

// read is one attempt of a pull: found reports messages (or an offset to
// correct) to answer with at once; due, when set, is when the retry copy
// that holds up the queue may go.
func (s *Server) read(p pullRequest) (resp *command, due time.Time, found bool, err error) {
	next := p.offset
	var min, max int64
	var body []byte
	if name, isLog := storeTopic(p.topic); isLog {
		tp, err := s.topic(name)
		if err != nil {
			return nil, time.Time{}, false, err
		}
		if tp != nil {
			min, max = s.bounds(tp, p.queue)
			next = clamp(p.offset, min, max)
			next, body, due, err = s.readQueue(tp, p, next, max)
			if err != nil {
				return nil, time.Time{}, false, err
			}
		}
	}
	ext := map[string]string{
		"nextBeginOffset": strconv.FormatInt(next, 10), "minOffset": strconv.FormatInt(min, 10),
		"maxOffset": strconv.FormatInt(max, 10), "suggestWhichBrokerId": "0",
	}
	switch {
	case len(body) > 0:
		return ok(ext, body), due, true, nil
	case next != p.offset:
		// Past filtered-out messages, or an offset out of range corrected.
		return &command{Code: codePullRetryImmediately, Version: version, ExtFields: ext}, due, true, nil
	}
	return &command{Code: codePullNotFound, Version: version, ExtFields: ext}, due, false, nil
}

func clamp(v, lo, hi int64) int64 { return min(max(v, lo), hi) }

// readQueue encodes the messages of queue p.queue from offset from (below
// max) that the subscription takes, and returns the offset after those it
// looked at.
func (s *Server) readQueue(tp *storepb.Topic, p pullRequest, from, max int64) (int64, []byte, time.Time, error) {
	var body []byte
	var due time.Time
	taken := 0
	off := from
	now := s.cfg.Broker.Now()
	err := s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		for ; off < max && taken < p.max && len(body) < maxPullBytes; off++ {
			seq := s.seqAt(p.queue, off)
			m, err := tx.Message(tp.Name, seq)
			if errors.Is(err, halfstore.ErrNotFound) {
				continue // trimmed by retention meanwhile
			}
			if err != nil {
				return err
			}
			if at, ok := dueAt(m); ok && at.After(now) {
				due = at // a retry copy holds up its queue until its time
				return nil
			}
			if !p.tags.match(m.Properties) {
				continue
			}
			body = appendStored(body, s.storedOf(p.topic, p.queue, off, m))
			taken++
		}
		return nil
	})
	return off, body, due, err
}

// storedOf is a committed message as a RocketMQ client reads it, in the
// topic the client asked for.
func (s *Server) storedOf(topic string, q int, off int64, m *storepb.Message) *stored {
	props := make(map[string]string, len(m.Properties)+1)
	for k, v := range m.Properties {
		props[k] = v
	}
	delete(props, propTranMsg)
	if props[propUniqKey] == "" {
		props[propUniqKey] = m.Id
	}
	delete(props, propDeliverAt)
	commitOffset := int64(m.Sequence)
	if isRetryTopic(topic) {
		commitOffset |= retryOffsetBit
	}
	times, _ := strconv.Atoi(props[propReconsumeTimes])
	at := time.Unix(0, m.CommittedAt).UnixMilli()
	return &stored{
		topic: topic, queueID: int32(q), queueOffset: off, commitOffset: commitOffset,
		bornAt: at, at: at, host: s.host, body: m.Body, props: props, reconsumeTimes: int32(times),
	}
}
