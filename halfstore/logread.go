package halfstore

import (
	"encoding/binary"
	"fmt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Lookups in topic logs for operators (brokerctl msg get and msg find):
// scans, as there is no index by message ID or key. Each is bounded by the
// caller: a time window, or a number of messages read.

// MessageInWindow finds message id among the messages of a topic committed
// from `from` to `to` (Unix ns): it starts at the first message committed
// at or after from (commit times are nearly monotonic: StartSeq's rule) and
// stops at the first committed after to.
func (t *Tx) MessageInWindow(topic, id string, from, to int64) (*storepb.Message, error) {
	tb, tp, err := t.topicWithMeta(topic)
	if err != nil {
		return nil, err
	}
	seq, err := startSeq(tb, tp, GroupStart{Time: max(from, 1)})
	if err != nil {
		return nil, err
	}
	c := tb.Bucket(bktLog).Cursor()
	for k, v := c.Seek(u64(seq)); k != nil; k, v = c.Next() {
		m, err := decodeMessage(topic, k, v)
		if err != nil {
			return nil, err
		}
		if m.CommittedAt > to {
			break
		}
		if m.Id == id {
			return m, nil
		}
	}
	return nil, fmt.Errorf("%w: message %s in topic %q", ErrNotFound, id, topic)
}

// KeyScan is what KeyMessages found.
type KeyScan struct {
	Found []*storepb.Message
	// Read: how many messages were read.
	Read int
	// Next is the sequence to go on from, 0 once the end of the log was
	// reached.
	Next uint64
}

// KeyMessages returns up to limit messages of a topic with the given key,
// reading at most budget messages from sequence from on.
func (t *Tx) KeyMessages(topic, key string, from uint64, limit, budget int) (KeyScan, error) {
	var out KeyScan
	b, err := t.existingTopic(topic)
	if err != nil {
		return out, err
	}
	c := b.Bucket(bktLog).Cursor()
	for k, v := c.Seek(u64(from)); k != nil; k, v = c.Next() {
		if out.Read == budget || len(out.Found) == limit {
			out.Next = binary.BigEndian.Uint64(k)
			return out, nil
		}
		out.Read++
		m, err := decodeMessage(topic, k, v)
		if err != nil {
			return out, err
		}
		if m.Key == key {
			out.Found = append(out.Found, m)
		}
	}
	return out, nil
}
