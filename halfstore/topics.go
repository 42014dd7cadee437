package halfstore

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Topics: bucket topics/<name> with its metadata and its log of committed
// messages, and Send's dedup records (dedup, dedup_time).

func (t *Tx) topicBucket(name string) *bolt.Bucket {
	return t.tx.Bucket(bktTopics).Bucket([]byte(name))
}

// existingTopic returns the bucket of a topic, ErrNotFound when there is
// none.
func (t *Tx) existingTopic(name string) (*bolt.Bucket, error) {
	b := t.topicBucket(name)
	if b == nil {
		return nil, fmt.Errorf("%w: topic %q", ErrNotFound, name)
	}
	return b, nil
}

// topicWithMeta returns the bucket of a topic and its metadata,
// ErrNotFound when there is none.
func (t *Tx) topicWithMeta(name string) (*bolt.Bucket, *storepb.Topic, error) {
	b, err := t.existingTopic(name)
	if err != nil {
		return nil, nil, err
	}
	tp, err := topicMeta(b)
	return b, tp, err
}

// CreateTopic creates a topic if it does not exist. It reports whether it
// created one.
func (t *Tx) CreateTopic(name string, now int64) (*storepb.Topic, bool, error) {
	if err := checkName("topic name", name); err != nil {
		return nil, false, err
	}
	if b := t.topicBucket(name); b != nil {
		tp, err := topicMeta(b)
		return tp, false, err
	}
	b, err := t.tx.Bucket(bktTopics).CreateBucket([]byte(name))
	if err != nil {
		return nil, false, err
	}
	for _, sub := range [][]byte{bktLog, bktGroups} {
		if _, err := b.CreateBucket(sub); err != nil {
			return nil, false, err
		}
	}
	tp := &storepb.Topic{Name: name, CreatedAt: now, FirstSequence: 1}
	return tp, true, put(b, keyMeta, tp)
}

func topicMeta(b *bolt.Bucket) (*storepb.Topic, error) {
	tp := &storepb.Topic{}
	if _, err := get(b, keyMeta, tp); err != nil {
		return nil, err
	}
	return tp, nil
}

// Topic returns a topic's metadata.
func (t *Tx) Topic(name string) (*storepb.Topic, error) {
	_, tp, err := t.topicWithMeta(name)
	return tp, err
}

// Topics lists every topic in name order.
func (t *Tx) Topics() ([]*storepb.Topic, error) {
	var out []*storepb.Topic
	err := t.tx.Bucket(bktTopics).ForEachBucket(func(k []byte) error {
		tp, err := topicMeta(t.tx.Bucket(bktTopics).Bucket(k))
		if err != nil {
			return err
		}
		out = append(out, tp)
		return nil
	})
	return out, err
}

// topicFor returns the bucket of a topic, creating the topic when asked.
func (t *Tx) topicFor(name string, create bool, now int64) (*bolt.Bucket, error) {
	if b := t.topicBucket(name); b != nil {
		return b, nil
	}
	if !create {
		return nil, fmt.Errorf("%w: topic %q (create it first, or enable auto-create-topics)", ErrNotFound, name)
	}
	if _, _, err := t.CreateTopic(name, now); err != nil {
		return nil, err
	}
	return t.topicBucket(name), nil
}

// logFillPercent is how full bbolt fills a topic log's pages when it splits
// them.
const logFillPercent = 0.95

// appendMessage gives m the topic's next sequence and stores it, keeping
// the topic's retained byte count.
func appendMessage(b *bolt.Bucket, m *storepb.Message) error {
	tp, err := topicMeta(b)
	if err != nil {
		return err
	}
	tp.LastSequence++
	m.Sequence = tp.LastSequence
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err
	}
	log := b.Bucket(bktLog)
	// The log only grows at its end: full pages instead of bbolt's
	// half-full splits, which would double its size on disk.
	log.FillPercent = logFillPercent
	if err := log.Put(u64(m.Sequence), v); err != nil {
		return err
	}
	tp.Bytes += uint64(len(v))
	return put(b, keyMeta, tp)
}

// Send appends a plain message to its topic. When m.Key is set and the same
// key was sent to the topic less than dedupWindow nanoseconds before now, it
// stores nothing and returns the first message with duplicate = true, or,
// when m has another body, refuses it with ErrConflict (content.go).
// m.Id must be set by the caller; m.CommittedAt is set to now.
func (t *Tx) Send(topic string, m *storepb.Message, createTopic bool, dedupWindow, now int64) (*storepb.Message, bool, error) {
	if err := checkName("message ID", m.Id); err != nil {
		return nil, false, err
	}
	if len(m.Key) > maxName {
		return nil, false, fmt.Errorf("%w: key is over %d bytes", ErrInvalid, maxName)
	}
	if len(m.OrderingKey) > maxName {
		return nil, false, fmt.Errorf("%w: ordering key is over %d bytes", ErrInvalid, maxName)
	}
	b, err := t.topicFor(topic, createTopic, now)
	if err != nil {
		return nil, false, err
	}
	var dk []byte
	old := &storepb.Dedup{}
	found := false
	if m.Key != "" {
		dk = []byte(topic + "\x00" + m.Key)
		if found, err = get(t.tx.Bucket(bktDedup), dk, old); err != nil {
			return nil, false, err
		}
		if found && now-old.SentAt < dedupWindow {
			if err := sameSend(topic, m.Key, old, m.Body); err != nil {
				return nil, false, err
			}
			return &storepb.Message{Id: old.MessageId, Sequence: old.Sequence, CommittedAt: old.SentAt}, true, nil
		}
	}
	m.CommittedAt = now
	if err := appendMessage(b, m); err != nil {
		return nil, false, err
	}
	if dk == nil {
		return m, false, nil
	}
	times := t.tx.Bucket(bktDedupTime)
	if found {
		// One time entry per record, so pruning never meets a stale one.
		if err := times.Delete(dedupTimeKey(old.SentAt, dk)); err != nil {
			return nil, false, err
		}
	}
	d := &storepb.Dedup{MessageId: m.Id, Sequence: m.Sequence, SentAt: now, ContentHash: contentHash(m.Body)}
	if err := put(t.tx.Bucket(bktDedup), dk, d); err != nil {
		return nil, false, err
	}
	return m, false, times.Put(dedupTimeKey(now, dk), present)
}

// ReadTopic returns up to limit committed messages of a topic with sequence
// >= from, in order.
func (t *Tx) ReadTopic(topic string, from uint64, limit int) ([]*storepb.Message, error) {
	b, err := t.existingTopic(topic)
	if err != nil {
		return nil, err
	}
	var out []*storepb.Message
	c := b.Bucket(bktLog).Cursor()
	for k, v := c.Seek(u64(from)); k != nil && len(out) < limit; k, v = c.Next() {
		m, err := decodeMessage(topic, k, v)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// decodeMessage is the committed message stored under k in a topic's log.
func decodeMessage(topic string, k, v []byte) (*storepb.Message, error) {
	m := &storepb.Message{}
	if err := proto.Unmarshal(v, m); err != nil {
		return nil, fmt.Errorf("halfstore: corrupt message %s/%x: %w", topic, k, err)
	}
	return m, nil
}

// Message returns one committed message.
func (t *Tx) Message(topic string, seq uint64) (*storepb.Message, error) {
	b, err := t.existingTopic(topic)
	if err != nil {
		return nil, err
	}
	m := &storepb.Message{}
	found, err := get(b.Bucket(bktLog), u64(seq), m)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: message %s/%d", ErrNotFound, topic, seq)
	}
	return m, nil
}
