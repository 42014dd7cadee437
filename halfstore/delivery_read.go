package halfstore

import (
	"encoding/binary"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// GroupMessage is a message of a topic's log with a consumer group's
// failure state for it.
type GroupMessage struct {
	Message *storepb.Message
	// Retry holds the group's failed deliveries of the message so far; nil
	// when it never failed, or is acked.
	Retry *storepb.Retry
}

// ReadGroupLog returns up to limit messages of the topic log with sequence
// >= from, in order, each with the group's retry record. A dispatcher reads
// its backlog through here: the retry records of the batch come from one
// range read of the group's retry bucket, not a lookup per message.
func (t *Tx) ReadGroupLog(topic, group string, from uint64, limit int) ([]GroupMessage, error) {
	if err := checkLimit("read group log", topic, group, limit); err != nil {
		return nil, err
	}
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	msgs, err := t.ReadTopic(topic, from, limit)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	out := make([]GroupMessage, len(msgs))
	for i, m := range msgs {
		out[i].Message = m
	}
	b := gt.gb.Bucket(bktRetry)
	if b == nil {
		return out, nil
	}
	last := msgs[len(msgs)-1].Sequence
	i := 0
	c := b.Cursor()
	for k, v := c.Seek(u64(msgs[0].Sequence)); k != nil; k, v = c.Next() {
		if len(k) != 8 {
			return nil, fmt.Errorf("halfstore: corrupt retry key %x in group %q of topic %q", k, group, topic)
		}
		seq := binary.BigEndian.Uint64(k)
		if seq > last {
			break
		}
		for i < len(out) && out[i].Message.Sequence < seq {
			i++
		}
		if out[i].Message.Sequence != seq {
			continue
		}
		r := &storepb.Retry{}
		if err := proto.Unmarshal(v, r); err != nil {
			return nil, fmt.Errorf("halfstore: corrupt retry record %s/%s/%d: %w", topic, group, seq, err)
		}
		out[i].Retry = r
	}
	return out, nil
}
