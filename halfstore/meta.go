package halfstore

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Bucket meta: the last applied Raft index, the latest time stamped into
// an applied command, and the schema version of the layout (layout.go)
// with the migrations that bring an older store to it.

// AppliedIndex is the last Raft index recorded in this transaction's view.
func (t *Tx) AppliedIndex() uint64 {
	v := t.tx.Bucket(bktMeta).Get(keyApplied)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// SetAppliedIndex records the last applied Raft index, in the same
// transaction as the effects of the entries up to it.
func (t *Tx) SetAppliedIndex(idx uint64) error {
	return t.tx.Bucket(bktMeta).Put(keyApplied, u64(idx))
}

// Stamp is the latest time (Unix nanoseconds) stamped into a command
// applied to this store, 0 before the first: the floor below which a
// leader never stamps (stamps never go backwards).
func (t *Tx) Stamp() int64 {
	v := t.tx.Bucket(bktMeta).Get(keyStamp)
	if len(v) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

// SetStamp records the latest stamp applied, in the same transaction as
// the commands that carried it.
func (t *Tx) SetStamp(ns int64) error {
	return t.tx.Bucket(bktMeta).Put(keyStamp, u64(uint64(ns)))
}

// migration takes a store from one schema version to the next.
type migration struct {
	what string
	run  func(*bolt.Tx) error
}

// migrations[v] takes a store from schema version v to v+1. A store
// without meta/schema_version is version 0: every store written before
// versions existed. Every node migrates its own copy, so a step must be
// deterministic (the copies must stay equal in content), must leave the
// applied index alone, and must never change once released: a new layout
// is a new step.
var migrations = [...]migration{
	{"create missing buckets, give every topic first_sequence and bytes", migrateTo1},
	{"give half messages and dedup keys the content hash of their body", migrateTo2},
}

// SchemaVersion is the version of the layout this code reads and writes,
// kept in meta/schema_version.
const SchemaVersion = uint64(len(migrations))

// migrate brings the store in db to SchemaVersion. A new store (no bucket
// at all) is created at it; an older one is migrated one version at a
// time, each step in one transaction that also records the version it
// reached, so a crash between steps resumes after the last one done. A store
// at the current version is only read. A newer one is refused.
func migrate(db *bolt.DB) error {
	var v uint64
	var fresh bool
	err := db.View(func(btx *bolt.Tx) error {
		var err error
		v, fresh, err = storedVersion(btx)
		return err
	})
	if err != nil {
		return err
	}
	if fresh {
		return db.Update(func(btx *bolt.Tx) error {
			if err := createRoots(btx); err != nil {
				return err
			}
			return setVersion(btx, SchemaVersion)
		})
	}
	if v > SchemaVersion {
		return fmt.Errorf("%w; it is at schema version %d and this txmq knows versions up to %d: run a txmq that knows version %d (a store is never downgraded)",
			ErrNewerSchema, v, SchemaVersion, v)
	}
	for ; v < SchemaVersion; v++ {
		m := migrations[v]
		err := db.Update(func(btx *bolt.Tx) error {
			if err := m.run(btx); err != nil {
				return err
			}
			return setVersion(btx, v+1)
		})
		if err != nil {
			return fmt.Errorf("migrate to schema version %d (%s): %w", v+1, m.what, err)
		}
	}
	return nil
}

// storedVersion reads the schema version of a store; fresh means the file
// has no bucket at all (just created by bbolt).
func storedVersion(btx *bolt.Tx) (v uint64, fresh bool, err error) {
	if k, _ := btx.Cursor().First(); k == nil {
		return 0, true, nil
	}
	meta := btx.Bucket(bktMeta)
	if meta == nil {
		return 0, false, nil
	}
	raw := meta.Get(keySchemaVersion)
	if raw == nil {
		return 0, false, nil
	}
	if len(raw) != 8 {
		return 0, false, fmt.Errorf("corrupt schema version %x in bucket meta", raw)
	}
	return binary.BigEndian.Uint64(raw), false, nil
}

func setVersion(btx *bolt.Tx, v uint64) error {
	return btx.Bucket(bktMeta).Put(keySchemaVersion, u64(v))
}

// migrateTo1 does once what version 0 code did lazily, so that the code
// needs no check for it:
//
//   - root buckets were created on every open;
//   - a consumer group's retry, dlq and redrive buckets were created by its
//     first write that needed them (groups older than them had none);
//   - a topic's first_sequence was 0 until its first append (and a topic
//     older than first_sequence and bytes had neither): 0 read as 1, and
//     bytes undercounted the log.
//
// Afterwards every root and nested bucket exists, every topic's
// first_sequence is at least 1 (the next sequence to come when its log is
// empty, as CreateTopic now writes it), and bytes is the encoded size of
// its retained log.
func migrateTo1(btx *bolt.Tx) error {
	if err := createRoots(btx); err != nil {
		return err
	}
	topics := btx.Bucket(bktTopics)
	names, err := bucketNames(topics)
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := topicTo1(topics.Bucket(name)); err != nil {
			return fmt.Errorf("topic %q: %w", name, err)
		}
	}
	return nil
}

func topicTo1(tb *bolt.Bucket) error {
	for _, sub := range [][]byte{bktLog, bktGroups} {
		if _, err := tb.CreateBucketIfNotExists(sub); err != nil {
			return err
		}
	}
	groups := tb.Bucket(bktGroups)
	names, err := bucketNames(groups)
	if err != nil {
		return err
	}
	for _, name := range names {
		for _, sub := range [][]byte{bktAcked, bktRetry, bktDLQ, bktRedrive} {
			if _, err := groups.Bucket(name).CreateBucketIfNotExists(sub); err != nil {
				return fmt.Errorf("consumer group %q: %w", name, err)
			}
		}
	}
	tp, err := topicMeta(tb)
	if err != nil {
		return err
	}
	var size uint64
	err = tb.Bucket(bktLog).ForEach(func(_, v []byte) error {
		size += uint64(len(v))
		return nil
	})
	if err != nil {
		return err
	}
	if tp.FirstSequence >= 1 && tp.Bytes == size {
		return nil
	}
	tp.FirstSequence = max(tp.FirstSequence, 1)
	tp.Bytes = size
	return put(tb, keyMeta, tp)
}

// bucketNames lists the nested buckets of b, so that they can be changed
// after the scan (bbolt forbids changes during one).
func bucketNames(b *bolt.Bucket) ([][]byte, error) {
	var out [][]byte
	err := b.ForEachBucket(func(k []byte) error {
		out = append(out, bytes.Clone(k))
		return nil
	})
	return out, err
}

// migrateTo2 gives half messages and dedup records the content hash that a
// repeat of their transaction ID or key is compared with (content.go),
// wherever the body is still at hand: a pending or expired half message
// holds its own; a committed one, and a dedup record, find theirs in the
// topic log unless retention dropped it. A rolled-back half message, and a
// record whose message is gone, stay without one and are not compared by
// body.
func migrateTo2(btx *bolt.Tx) error {
	topics := btx.Bucket(bktTopics)
	err := rewrite(btx.Bucket(bktHalf), func(_, v []byte) (proto.Message, error) {
		h := &storepb.Half{}
		if err := proto.Unmarshal(v, h); err != nil || len(h.ContentHash) > 0 {
			return nil, err
		}
		switch h.State {
		case storepb.HalfState_HALF_STATE_PENDING, storepb.HalfState_HALF_STATE_EXPIRED:
			h.ContentHash = contentHash(h.Body)
			return h, nil
		case storepb.HalfState_HALF_STATE_COMMITTED:
			m, err := loggedMessage(topics, h.Topic, h.Sequence, h.Id)
			if err != nil || m == nil {
				return nil, err
			}
			h.ContentHash = contentHash(m.Body)
			return h, nil
		}
		return nil, nil
	})
	if err != nil {
		return err
	}
	return rewrite(btx.Bucket(bktDedup), func(k, v []byte) (proto.Message, error) {
		d := &storepb.Dedup{}
		topic, _, ok := bytes.Cut(k, []byte{0})
		if err := proto.Unmarshal(v, d); err != nil || len(d.ContentHash) > 0 || !ok {
			return nil, err
		}
		m, err := loggedMessage(topics, string(topic), d.Sequence, d.MessageId)
		if err != nil || m == nil {
			return nil, err
		}
		d.ContentHash = contentHash(m.Body)
		return d, nil
	})
}

// rewrite puts back the records of b that change returns changed (nil:
// unchanged), after the scan: bbolt forbids changes during one.
func rewrite(b *bolt.Bucket, change func(k, v []byte) (proto.Message, error)) error {
	changed := map[string]proto.Message{}
	err := b.ForEach(func(k, v []byte) error {
		m, err := change(k, v)
		if m != nil {
			changed[string(k)] = m
		}
		if err != nil {
			return fmt.Errorf("record %q: %w", k, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for k, m := range changed {
		if err := put(b, []byte(k), m); err != nil {
			return err
		}
	}
	return nil
}

// loggedMessage is message id at seq in topic's log, or nil when the log no
// longer holds it.
func loggedMessage(topics *bolt.Bucket, topic string, seq uint64, id string) (*storepb.Message, error) {
	tb := topics.Bucket([]byte(topic))
	if tb == nil {
		return nil, nil
	}
	v := tb.Bucket(bktLog).Get(u64(seq))
	if v == nil {
		return nil, nil
	}
	m, err := decodeMessage(topic, u64(seq), v)
	if err != nil || m.Id != id {
		return nil, err
	}
	return m, nil
}
