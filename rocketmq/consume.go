package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Queues and offsets. A topic's log is one sequence 1, 2, 3, ...; it is
// shown as Queues queues: sequence s is in queue (s-1) mod Queues at
// offset (s-1) div Queues. Each queue's offsets are then dense, as
// RocketMQ clients expect (next offset = offset + 1).

// position is the queue and offset of sequence seq (0: none).
func (s *Server) position(seq uint64) (int, int64) {
	if seq == 0 {
		return 0, 0
	}
	n := uint64(s.cfg.Queues)
	return int((seq - 1) % n), int64((seq - 1) / n)
}

// seqAt is the sequence at offset off of queue q.
func (s *Server) seqAt(q int, off int64) uint64 {
	return uint64(off)*uint64(s.cfg.Queues) + uint64(q) + 1
}

// countIn is the number of sequences 1..last in queue q: the offset
// after them.
func (s *Server) countIn(q int, last uint64) int64 {
	if last <= uint64(q) {
		return 0
	}
	return int64((last-1-uint64(q))/uint64(s.cfg.Queues)) + 1
}

// bounds are a queue's min offset (its oldest retained message) and max
// offset (the offset after its last message).
func (s *Server) bounds(tp *storepb.Topic, q int) (min, max int64) {
	first := tp.FirstSequence
	if first == 0 {
		first = 1
	}
	return s.countIn(q, first-1), s.countIn(q, tp.LastSequence)
}

// queueOf reads the queue ID of a request and checks it.
func (s *Server) queueOf(req *command) (int, error) {
	q, err := req.intField(-1, "queueId")
	if err != nil {
		return 0, err
	}
	if q < 0 || q >= int64(s.cfg.Queues) {
		return 0, fmt.Errorf("queue %d does not exist: topics have queues 0 to %d", q, s.cfg.Queues-1)
	}
	return int(q), nil
}

// topic reads a topic's metadata; nil when it does not exist.
func (s *Server) topic(name string) (*storepb.Topic, error) {
	var tp *storepb.Topic
	err := s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		var err error
		tp, err = tx.Topic(name)
		return err
	})
	if errors.Is(err, halfstore.ErrNotFound) {
		return nil, nil
	}
	return tp, err
}

// offsetQuery answers GET_MAX_OFFSET, GET_MIN_OFFSET and
// SEARCH_OFFSET_BY_TIMESTAMP.
func (s *Server) offsetQuery(req *command) *command {
	name := req.field("topic")
	q, err := s.queueOf(req)
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	var off int64
	if store, ok := storeTopic(name); ok {
		tp, err := s.topic(store)
		if err != nil {
			return fail(codeSystemError, err.Error())
		}
		if tp != nil {
			min, max := s.bounds(tp, q)
			switch req.Code {
			case reqGetMaxOffset:
				off = max
			case reqGetMinOffset:
				off = min
			default:
				ts, err := req.intField(0, "timestamp")
				if err != nil {
					return fail(codeSystemError, err.Error())
				}
				if off, err = s.searchOffset(store, q, min, max, ts); err != nil {
					return fail(codeSystemError, err.Error())
				}
			}
		}
	}
	return ok(map[string]string{"offset": strconv.FormatInt(off, 10)}, nil)
}

// searchOffset is the first offset of queue q in [min, max) whose message
// was committed at or after ts (Unix milliseconds), max if none: a binary
// search, since commit order is time order on the leader's clock.
func (s *Server) searchOffset(topic string, q int, min, max, ts int64) (int64, error) {
	lo, hi := min, max
	err := s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		for lo < hi {
			mid := lo + (hi-lo)/2
			m, err := tx.Message(topic, s.seqAt(q, mid))
			if errors.Is(err, halfstore.ErrNotFound) {
				lo = mid + 1 // trimmed meanwhile
				continue
			}
			if err != nil {
				return err
			}
			if time.Unix(0, m.CommittedAt).UnixMilli() >= ts {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return nil
	})
	return lo, err
}

// ensureGroup creates txmq's consumer group of a RocketMQ group on a topic
// that exists, starting where the client's consumeFromWhere says: the
// group's acks are the RocketMQ group's committed offsets.
func (s *Server) ensureGroup(topic, group, where string) {
	if !s.cfg.Broker.Node().IsLeader() {
		return
	}
	tp, err := s.topic(topic)
	if err != nil || tp == nil {
		return
	}
	start := raftpb.StartPosition_START_POSITION_EARLIEST
	if where == "CONSUME_FROM_LAST_OFFSET" {
		start = raftpb.StartPosition_START_POSITION_LATEST
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	exists := false
	s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		_, err := tx.Group(topic, group)
		exists = err == nil
		return nil
	})
	if exists {
		return
	}
	if _, err := s.cfg.Broker.Node().CreateGroup(ctx, s.cfg.Broker.Now(), &raftpb.CreateGroup{
		Topic: topic, Group: group, Start: start, AutoCreated: true,
	}); err != nil {
		s.log.Warn("consumer group not created", "topic", topic, "group", group, "err", err)
	}
}

// committed is the group's committed offset on queue q: the offset of its
// first sequence that the txmq group has not acked.
func (s *Server) committed(tx *halfstore.Tx, topic, group string, q int) (int64, error) {
	g, err := tx.Group(topic, group)
	if err != nil {
		return 0, err
	}
	above, err := tx.AckedAbove(topic, group)
	if err != nil {
		return 0, err
	}
	acked := make(map[uint64]bool, len(above))
	for _, a := range above {
		acked[a] = true
	}
	off := s.countIn(q, g.AckedThrough)
	for acked[s.seqAt(q, off)] {
		off++
	}
	return off, nil
}

func (s *Server) queryConsumerOffset(req *command) *command {
	topic, group := req.field("topic"), req.field("consumerGroup")
	q, err := s.queueOf(req)
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	// The offsets a stopping instance committed just before, without
	// waiting for the answer.
	if err := s.offsets.wait(ctx, group, topic); err != nil {
		return fail(codeSystemError, "waiting for the group's offset commits: "+err.Error())
	}
	topic, isLog := storeTopic(topic)
	if !isLog {
		return fail(codeQueryNotFound, "txmq keeps no offsets of a dead-letter queue")
	}
	if err := s.cfg.Broker.Barrier(ctx); err != nil {
		return s.refusal(err)
	}
	var off int64
	err = s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		off, err = s.committed(tx, topic, group, q)
		return err
	})
	if errors.Is(err, halfstore.ErrNotFound) {
		return fail(codeQueryNotFound, fmt.Sprintf("group %s has no offset on topic %s", group, topic))
	}
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	return ok(map[string]string{"offset": strconv.FormatInt(off, 10)}, nil)
}

func (s *Server) updateConsumerOffset(req *command) *command {
	q, err := s.queueOf(req)
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	off, err := req.intField(-1, "commitOffset")
	if err != nil {
		return fail(codeSystemError, err.Error())
	}
	if err := s.commit(req.field("topic"), req.field("consumerGroup"), q, off); err != nil {
		return s.refusal(err)
	}
	return ok(nil, nil)
}

// maxAcks bounds the sequences of one Ack command.
const maxAcks = 4096

// commit makes off the group's committed offset on queue q: the txmq
// group acks every sequence of the queue below it. Offsets never go back.
func (s *Server) commit(topic, group string, q int, off int64) error {
	topic, isLog := storeTopic(topic)
	if !isLog || off <= 0 {
		return nil
	}
	tp, err := s.topic(topic)
	if err != nil || tp == nil {
		return err
	}
	s.ensureGroup(topic, group, "CONSUME_FROM_FIRST_OFFSET")
	var seqs []uint64
	err = s.cfg.Broker.Node().Store().View(func(tx *halfstore.Tx) error {
		from, err := s.committed(tx, topic, group, q)
		if err != nil {
			return err
		}
		for o := from; o < off && len(seqs) < maxAcks; o++ {
			seq := s.seqAt(q, o)
			if seq > tp.LastSequence {
				break
			}
			if done, err := tx.IsAcked(topic, group, seq); err != nil || done {
				if err != nil {
					return err
				}
				continue
			}
			seqs = append(seqs, seq)
		}
		return nil
	})
	if err != nil || len(seqs) == 0 {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err = s.cfg.Broker.Node().Ack(ctx, s.cfg.Broker.Now(), &raftpb.Ack{Topic: topic, Group: group, Sequences: seqs})
	return err
}

// tagFilter is a subscription expression: "*" (or empty) takes every
// message, "a || b" the messages tagged a or b.
type tagFilter map[string]bool

func parseTags(expr string) tagFilter {
	expr = strings.TrimSpace(expr)
	if expr == "" || expr == "*" {
		return nil
	}
	f := tagFilter{}
	for _, t := range strings.Split(expr, "||") {
		if t = strings.TrimSpace(t); t != "" {
			f[t] = true
		}
	}
	return f
}

func (f tagFilter) match(props map[string]string) bool { return f == nil || f[props[propTags]] }
