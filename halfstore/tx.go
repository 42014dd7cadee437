package halfstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// The on-disk layout. Root buckets:
//
//	meta       "applied_index" -> uint64 BE
//	half       message ID -> storepb.Half (pending, resolved, tombstones)
//	half_tx    producer group 0x00 transaction ID -> message ID
//	half_state state byte | message ID -> 1 (index for listing by state)
//	half_sched one nested bucket per producer group with pending messages:
//	             next check time BE | message ID -> 1 (what is due, in order)
//	half_resolved resolved_at BE | message ID -> 1 (COMMITTED and ROLLED_BACK
//	             halves by resolution time, for pruning)
//	producer_groups name -> storepb.ProducerGroup (check-back policy)
//	consumer_groups name -> storepb.ConsumerGroup (delivery policy)
//	nodes      Raft server ID -> storepb.Node (where each member serves the API)
//	dedup      topic 0x00 key -> storepb.Dedup (Send dedup window)
//	dedup_time sent_at BE | topic 0x00 key -> 1 (dedup records by age, for
//	             pruning; one entry per dedup record)
//	dlq_ids    consumer group 0x00 message ID -> topic 0x00 sequence BE
//	             (dead letters by message ID)
//	topics     one nested bucket per topic:
//	             "meta"   -> storepb.Topic
//	             "log"    sequence BE -> storepb.Message (first_sequence..last_sequence)
//	             "groups" one nested bucket per consumer group:
//	                        "meta"    -> storepb.Group (counters match the buckets below)
//	                        "acked"   sequence BE -> 1 (acks above acked_through)
//	                        "retry"   sequence BE -> storepb.Retry (unacked log
//	                                  messages that failed at least once)
//	                        "dlq"     sequence BE -> storepb.DeadLetter
//	                        "redrive" sequence BE -> storepb.DeadLetter (redriven,
//	                                  not yet acked)
var (
	bktMeta      = []byte("meta")
	bktHalf      = []byte("half")
	bktHalfTx    = []byte("half_tx")
	bktHalfState = []byte("half_state")
	bktHalfRes   = []byte("half_resolved")
	bktDedup     = []byte("dedup")
	bktDedupTime = []byte("dedup_time")
	bktTopics    = []byte("topics")
	bktHalfSched = []byte("half_sched")
	bktPGroups   = []byte("producer_groups")
	bktCGroups   = []byte("consumer_groups")
	bktNodes     = []byte("nodes")
	bktDLQIDs    = []byte("dlq_ids")

	keyApplied = []byte("applied_index")
	keyMeta    = []byte("meta")
	bktLog     = []byte("log")
	bktGroups  = []byte("groups")
	bktAcked   = []byte("acked")
	bktRetry   = []byte("retry")
	bktDLQ     = []byte("dlq")
	bktRedrive = []byte("redrive")
)

func createRoots(btx *bolt.Tx) error {
	for _, name := range [][]byte{
		bktMeta, bktHalf, bktHalfTx, bktHalfState, bktHalfRes, bktDedup, bktDedupTime,
		bktTopics, bktHalfSched, bktPGroups, bktCGroups, bktNodes, bktDLQIDs,
	} {
		if _, err := btx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return nil
}

// Tx is one bbolt transaction seen through txmq's buckets. Write methods are
// only valid inside Store.Update.
type Tx struct {
	tx *bolt.Tx
}

// present is the value of index entries whose key says everything: bbolt
// reads a key stored with an empty value back as nil within the writing
// transaction, which would make "is it there?" depend on batching.
var present = []byte{1}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func txKey(group, txID string) []byte {
	return []byte(group + "\x00" + txID)
}

func stateKey(st storepb.HalfState, id string) []byte {
	return append([]byte{byte(st)}, id...)
}

func put(b *bolt.Bucket, key []byte, m proto.Message) error {
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(key, v)
}

func get(b *bolt.Bucket, key []byte, m proto.Message) (bool, error) {
	v := b.Get(key)
	if v == nil {
		return false, nil
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return true, fmt.Errorf("halfstore: corrupt record %q: %w", key, err)
	}
	return true, nil
}

// StateName is how states are spelled in errors and listings.
func StateName(s storepb.HalfState) string {
	switch s {
	case storepb.HalfState_HALF_STATE_PENDING:
		return "PENDING"
	case storepb.HalfState_HALF_STATE_COMMITTED:
		return "COMMITTED"
	case storepb.HalfState_HALF_STATE_ROLLED_BACK:
		return "ROLLED_BACK"
	case storepb.HalfState_HALF_STATE_EXPIRED:
		return "EXPIRED"
	}
	return "UNSPECIFIED"
}

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

// ---- topics ----

func (t *Tx) topicBucket(name string) *bolt.Bucket {
	return t.tx.Bucket(bktTopics).Bucket([]byte(name))
}

// maxName bounds names and keys that become bbolt keys (bbolt's own limit
// is 32 KiB). The broker's limits are tighter; this keeps the FSM from
// failing on a command that slipped past them.
const maxName = 4096

func checkName(kind, name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("%w: %s must be 1 to %d bytes", ErrInvalid, kind, maxName)
	}
	return nil
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
	tp := &storepb.Topic{Name: name, CreatedAt: now}
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
	b := t.topicBucket(name)
	if b == nil {
		return nil, fmt.Errorf("%w: topic %q", ErrNotFound, name)
	}
	return topicMeta(b)
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

// appendMessage gives m the topic's next sequence and stores it, keeping
// the topic's first sequence and retained byte count.
// logFillPercent is how full bbolt fills a topic log's pages when it splits
// them.
const logFillPercent = 0.95

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
	tp.FirstSequence = firstSeq(tp)
	tp.Bytes += uint64(len(v))
	return put(b, keyMeta, tp)
}

// firstSeq is the oldest retained sequence, or the next one to come when
// the log is empty.
func firstSeq(tp *storepb.Topic) uint64 {
	if tp.FirstSequence == 0 {
		// Never trimmed (or written before first_sequence existed): the
		// log starts at 1.
		return 1
	}
	return tp.FirstSequence
}

func dedupTimeKey(sentAt int64, dk []byte) []byte {
	return append(u64(uint64(sentAt)), dk...)
}

// Send appends a plain message to its topic. When m.Key is set and the same
// key was sent to the topic less than dedupWindow nanoseconds before now, it
// stores nothing and returns the first message with duplicate = true.
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
	d := &storepb.Dedup{MessageId: m.Id, Sequence: m.Sequence, SentAt: now}
	if err := put(t.tx.Bucket(bktDedup), dk, d); err != nil {
		return nil, false, err
	}
	return m, false, times.Put(dedupTimeKey(now, dk), present)
}

// ReadTopic returns up to limit committed messages of a topic with sequence
// >= from, in order.
func (t *Tx) ReadTopic(topic string, from uint64, limit int) ([]*storepb.Message, error) {
	b := t.topicBucket(topic)
	if b == nil {
		return nil, fmt.Errorf("%w: topic %q", ErrNotFound, topic)
	}
	var out []*storepb.Message
	c := b.Bucket(bktLog).Cursor()
	for k, v := c.Seek(u64(from)); k != nil && len(out) < limit; k, v = c.Next() {
		m := &storepb.Message{}
		if err := proto.Unmarshal(v, m); err != nil {
			return nil, fmt.Errorf("halfstore: corrupt message %s/%x: %w", topic, k, err)
		}
		out = append(out, m)
	}
	return out, nil
}

// Message returns one committed message.
func (t *Tx) Message(topic string, seq uint64) (*storepb.Message, error) {
	b := t.topicBucket(topic)
	if b == nil {
		return nil, fmt.Errorf("%w: topic %q", ErrNotFound, topic)
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

// ---- half messages ----

// PutHalf stores a new PENDING half message. If (producer group,
// transaction ID) already exists it stores nothing and returns the existing
// record with duplicate = true, whatever its state. The caller sets Id,
// Topic, ProducerGroup, TransactionId, CreatedAt and CheckAfter.
func (t *Tx) PutHalf(h *storepb.Half, createTopic bool) (*storepb.Half, bool, error) {
	if h.Id == "" || h.ProducerGroup == "" || h.TransactionId == "" {
		return nil, false, fmt.Errorf("%w: half message needs an ID, a producer group and a transaction ID", ErrInvalid)
	}
	for _, f := range []struct{ kind, v string }{
		{"message ID", h.Id}, {"producer group", h.ProducerGroup}, {"transaction ID", h.TransactionId},
	} {
		if err := checkName(f.kind, f.v); err != nil {
			return nil, false, err
		}
	}
	if len(h.OrderingKey) > maxName {
		return nil, false, fmt.Errorf("%w: ordering key is over %d bytes", ErrInvalid, maxName)
	}
	tk := txKey(h.ProducerGroup, h.TransactionId)
	if id := t.tx.Bucket(bktHalfTx).Get(tk); id != nil {
		existing, err := t.Half(string(id))
		return existing, true, err
	}
	if t.tx.Bucket(bktHalf).Get([]byte(h.Id)) != nil {
		return nil, false, fmt.Errorf("%w: message ID %s already used", ErrInvalid, h.Id)
	}
	if _, err := t.topicFor(h.Topic, createTopic, h.CreatedAt); err != nil {
		return nil, false, err
	}
	h.State = storepb.HalfState_HALF_STATE_PENDING
	h.BodySize = uint32(len(h.Body))
	h.NextCheckAt = h.CreatedAt + h.CheckAfter
	if err := t.writeHalf(h, storepb.HalfState_HALF_STATE_UNSPECIFIED); err != nil {
		return nil, false, err
	}
	if err := t.tx.Bucket(bktHalfTx).Put(tk, []byte(h.Id)); err != nil {
		return nil, false, err
	}
	return h, false, t.schedule(h)
}

// writeHalf stores h and moves its state index entry from old to h.State.
func (t *Tx) writeHalf(h *storepb.Half, old storepb.HalfState) error {
	if err := put(t.tx.Bucket(bktHalf), []byte(h.Id), h); err != nil {
		return err
	}
	idx := t.tx.Bucket(bktHalfState)
	if old != storepb.HalfState_HALF_STATE_UNSPECIFIED && old != h.State {
		if err := idx.Delete(stateKey(old, h.Id)); err != nil {
			return err
		}
	}
	return idx.Put(stateKey(h.State, h.Id), present)
}

// Half returns a half message by message ID.
func (t *Tx) Half(id string) (*storepb.Half, error) {
	h := &storepb.Half{}
	found, err := get(t.tx.Bucket(bktHalf), []byte(id), h)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("%w: half message %q", ErrNotFound, id)
	}
	return h, nil
}

// HalfIDByTx finds a half message's ID by producer group and transaction ID.
func (t *Tx) HalfIDByTx(group, txID string) (string, error) {
	id := t.tx.Bucket(bktHalfTx).Get(txKey(group, txID))
	if id == nil {
		return "", fmt.Errorf("%w: transaction %q of producer group %q", ErrNotFound, txID, group)
	}
	return string(id), nil
}

// Resolution is what Resolve is asked to do.
type Resolution int

// Resolutions.
const (
	Commit Resolution = iota + 1
	Rollback
)

func (r Resolution) target() storepb.HalfState {
	if r == Commit {
		return storepb.HalfState_HALF_STATE_COMMITTED
	}
	return storepb.HalfState_HALF_STATE_ROLLED_BACK
}

func (r Resolution) verb() string {
	if r == Commit {
		return "commit"
	}
	return "roll back"
}

// Resolve commits or rolls back a half message.
//
//   - PENDING: resolved as asked. A commit appends the message to its topic.
//   - Already in the asked state: nothing changes, no error (idempotent).
//   - Resolved the other way: ErrConflict naming the state (first
//     resolution wins).
//   - EXPIRED: only SOURCE_OPERATOR may resolve it; others get ErrExpired.
//
// The body is dropped from the half record once resolved: it lives on in the
// topic log (commit) or nowhere (rollback, which leaves a tombstone).
// changed is false when the message already was in the asked state.
func (t *Tx) Resolve(id string, r Resolution, source storepb.Source, now int64) (h *storepb.Half, changed bool, err error) {
	if r != Commit && r != Rollback {
		return nil, false, fmt.Errorf("%w: resolution must be commit or rollback", ErrInvalid)
	}
	switch source {
	case storepb.Source_SOURCE_PRODUCER, storepb.Source_SOURCE_CHECKBACK, storepb.Source_SOURCE_OPERATOR:
	default:
		return nil, false, fmt.Errorf("%w: a resolution comes from a producer, a check-back or an operator, not %s", ErrInvalid, source)
	}
	if h, err = t.Half(id); err != nil {
		return nil, false, err
	}
	want := r.target()
	switch h.State {
	case want:
		return h, false, nil
	case storepb.HalfState_HALF_STATE_PENDING:
	case storepb.HalfState_HALF_STATE_EXPIRED:
		if source != storepb.Source_SOURCE_OPERATOR {
			return h, false, fmt.Errorf("%w: half message %s is EXPIRED; only an operator can %s it now (brokerctl half commit|rollback)", ErrExpired, id, r.verb())
		}
	default:
		return h, false, fmt.Errorf("%w: half message %s is %s, cannot %s", ErrConflict, id, StateName(h.State), r.verb())
	}
	old := h.State
	if err := t.unschedule(h); err != nil {
		return nil, false, err
	}
	if r == Commit {
		b, err := t.topicFor(h.Topic, true, now)
		if err != nil {
			return nil, false, err
		}
		m := &storepb.Message{
			Id:            h.Id,
			Key:           h.Key,
			Properties:    h.Properties,
			Body:          h.Body,
			CommittedAt:   now,
			ProducerGroup: h.ProducerGroup,
			TransactionId: h.TransactionId,
			OrderingKey:   h.OrderingKey,
		}
		if err := appendMessage(b, m); err != nil {
			return nil, false, err
		}
		h.Sequence = m.Sequence
	}
	h.State = want
	h.ResolvedAt = now
	h.ResolutionSource = source
	h.Body = nil
	h.NextCheckAt = 0
	if err := t.writeHalf(h, old); err != nil {
		return nil, false, err
	}
	return h, true, t.markResolved(h)
}

// markResolved indexes a half message that reached COMMITTED or
// ROLLED_BACK, so that Prune finds the old ones without a scan.
func (t *Tx) markResolved(h *storepb.Half) error {
	return t.tx.Bucket(bktHalfRes).Put(append(u64(uint64(h.ResolvedAt)), h.Id...), present)
}

// Expire ends a PENDING half message whose checks are used up or that is
// too old: parked as EXPIRED for an operator, or, when rollback is set (the
// group's expiry action), rolled back with source EXPIRY. Expiring an
// EXPIRED message changes nothing (changed false); a resolved one is left
// alone and reported with ErrConflict.
func (t *Tx) Expire(id string, now int64, rollback bool) (h *storepb.Half, changed bool, err error) {
	if h, err = t.Half(id); err != nil {
		return nil, false, err
	}
	switch h.State {
	case storepb.HalfState_HALF_STATE_EXPIRED:
		return h, false, nil
	case storepb.HalfState_HALF_STATE_PENDING:
	default:
		return h, false, fmt.Errorf("%w: half message %s is %s, cannot expire", ErrConflict, id, StateName(h.State))
	}
	if err := t.unschedule(h); err != nil {
		return nil, false, err
	}
	h.State = storepb.HalfState_HALF_STATE_EXPIRED
	if rollback {
		h.State = storepb.HalfState_HALF_STATE_ROLLED_BACK
		h.Body = nil
	}
	h.ResolvedAt = now
	h.ResolutionSource = storepb.Source_SOURCE_EXPIRY
	h.NextCheckAt = 0
	if err := t.writeHalf(h, storepb.HalfState_HALF_STATE_PENDING); err != nil {
		return nil, false, err
	}
	if rollback {
		return h, true, t.markResolved(h)
	}
	return h, true, nil
}

// RecordCheck records a check-back of a PENDING message that got no
// resolution: when reached (the check got to a producer) it uses one
// attempt; errMsg is kept as the last check error; the next check is due at
// next. A message resolved meanwhile is left alone (ErrConflict).
func (t *Tx) RecordCheck(id string, reached bool, errMsg string, next int64) (*storepb.Half, error) {
	h, err := t.Half(id)
	if err != nil {
		return nil, err
	}
	if h.State != storepb.HalfState_HALF_STATE_PENDING {
		return h, fmt.Errorf("%w: half message %s is %s, no longer checked", ErrConflict, id, StateName(h.State))
	}
	if err := t.unschedule(h); err != nil {
		return nil, err
	}
	if reached {
		h.CheckAttempts++
	}
	h.LastCheckError = errMsg
	h.NextCheckAt = next
	if err := put(t.tx.Bucket(bktHalf), []byte(h.Id), h); err != nil {
		return nil, err
	}
	return h, t.schedule(h)
}

func schedKey(at int64, id string) []byte {
	return append(u64(uint64(at)), id...)
}

// schedule puts a pending message in its group's check schedule.
func (t *Tx) schedule(h *storepb.Half) error {
	b, err := t.tx.Bucket(bktHalfSched).CreateBucketIfNotExists([]byte(h.ProducerGroup))
	if err != nil {
		return err
	}
	return b.Put(schedKey(h.NextCheckAt, h.Id), present)
}

// unschedule takes a pending message out of the check schedule, and drops
// the group's bucket when it empties.
func (t *Tx) unschedule(h *storepb.Half) error {
	if h.State != storepb.HalfState_HALF_STATE_PENDING {
		return nil
	}
	root := t.tx.Bucket(bktHalfSched)
	b := root.Bucket([]byte(h.ProducerGroup))
	if b == nil {
		return nil
	}
	if err := b.Delete(schedKey(h.NextCheckAt, h.Id)); err != nil {
		return err
	}
	if k, _ := b.Cursor().First(); k == nil {
		return root.DeleteBucket([]byte(h.ProducerGroup))
	}
	return nil
}

// ScheduledGroups lists the producer groups that have pending messages.
func (t *Tx) ScheduledGroups() ([]string, error) {
	var out []string
	err := t.tx.Bucket(bktHalfSched).ForEachBucket(func(k []byte) error {
		out = append(out, string(k))
		return nil
	})
	return out, err
}

// DueHalf returns up to limit pending messages of a producer group whose
// next check is at or before now, earliest first, leaving out those skip
// says to (by ID, before reading them) and those keep refuses (after; a nil
// keep takes all). The cost follows what is due, not what is pending, and
// only kept records stay in memory.
func (t *Tx) DueHalf(group string, now int64, skip func(id string) bool, keep func(*storepb.Half) bool, limit int) ([]*storepb.Half, error) {
	b := t.tx.Bucket(bktHalfSched).Bucket([]byte(group))
	if b == nil {
		return nil, nil
	}
	var out []*storepb.Half
	c := b.Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		if len(k) < 8 {
			return nil, fmt.Errorf("halfstore: corrupt schedule key %x of group %q", k, group)
		}
		if int64(binary.BigEndian.Uint64(k[:8])) > now {
			break
		}
		id := string(k[8:])
		if skip != nil && skip(id) {
			continue
		}
		h, err := t.Half(id)
		if err != nil {
			return nil, err
		}
		if keep == nil || keep(h) {
			out = append(out, h)
		}
	}
	return out, nil
}

// NextCheck is when the earliest check of a producer group is due.
func (t *Tx) NextCheck(group string) (int64, bool) {
	b := t.tx.Bucket(bktHalfSched).Bucket([]byte(group))
	if b == nil {
		return 0, false
	}
	k, _ := b.Cursor().First()
	if len(k) < 8 {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(k[:8])), true
}

// ProducerGroup returns a producer group's check-back policy; a group
// without one gets an empty policy (all defaults).
func (t *Tx) ProducerGroup(name string) (*storepb.ProducerGroup, error) {
	pg := &storepb.ProducerGroup{}
	found, err := get(t.tx.Bucket(bktPGroups), []byte(name), pg)
	if err != nil {
		return nil, err
	}
	if !found {
		pg.Name = name
	}
	return pg, nil
}

// PutProducerGroup replaces a producer group's check-back policy. A cap of
// the check backoff below the backoff itself is refused when both are set.
func (t *Tx) PutProducerGroup(pg *storepb.ProducerGroup) error {
	if err := checkName("producer group", pg.Name); err != nil {
		return err
	}
	if pg.CheckBackoff > 0 && pg.MaxCheckBackoff > 0 && pg.MaxCheckBackoff < pg.CheckBackoff {
		return fmt.Errorf("halfstore: producer group %s: %w: max check backoff %s is below the check backoff %s",
			pg.Name, ErrInvalid, time.Duration(pg.MaxCheckBackoff), time.Duration(pg.CheckBackoff))
	}
	if _, ok := storepb.ExpiryAction_name[int32(pg.ExpiryAction)]; !ok {
		return fmt.Errorf("halfstore: producer group %s: %w: expiry action %d", pg.Name, ErrInvalid, pg.ExpiryAction)
	}
	return put(t.tx.Bucket(bktPGroups), []byte(pg.Name), pg)
}

// ListHalf lists half messages in message ID order, after the given ID.
// group "" matches every producer group; state UNSPECIFIED every state.
func (t *Tx) ListHalf(group string, state storepb.HalfState, after string, limit int) ([]*storepb.Half, error) {
	var out []*storepb.Half
	match := func(h *storepb.Half) {
		if group == "" || h.ProducerGroup == group {
			out = append(out, h)
		}
	}
	if state == storepb.HalfState_HALF_STATE_UNSPECIFIED {
		c := t.tx.Bucket(bktHalf).Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
		for ; k != nil && len(out) < limit; k, v = c.Next() {
			h := &storepb.Half{}
			if err := proto.Unmarshal(v, h); err != nil {
				return nil, fmt.Errorf("halfstore: corrupt half message %q: %w", k, err)
			}
			match(h)
		}
		return out, nil
	}
	prefix := []byte{byte(state)}
	c := t.tx.Bucket(bktHalfState).Cursor()
	k, _ := c.Seek(stateKey(state, after))
	if k != nil && string(k[1:]) == after {
		k, _ = c.Next()
	}
	for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, _ = c.Next() {
		h, err := t.Half(string(k[1:]))
		if err != nil {
			return nil, err
		}
		match(h)
	}
	return out, nil
}

// SetNode records (or, with an empty address, forgets) where a cluster
// member serves the API.
func (t *Tx) SetNode(id, grpcAddr string) error {
	if err := checkName("node ID", id); err != nil {
		return err
	}
	b := t.tx.Bucket(bktNodes)
	if grpcAddr == "" {
		return b.Delete([]byte(id))
	}
	return put(b, []byte(id), &storepb.Node{Id: id, GrpcAddress: grpcAddr})
}

// NodeAddr is where a cluster member serves the API, "" if unknown.
func (t *Tx) NodeAddr(id string) (string, error) {
	n := &storepb.Node{}
	if _, err := get(t.tx.Bucket(bktNodes), []byte(id), n); err != nil {
		return "", err
	}
	return n.GrpcAddress, nil
}

// PendingByGroup counts the pending messages of each producer group (from
// the schedule index: no record is read).
func (t *Tx) PendingByGroup() (map[string]int, error) {
	out := map[string]int{}
	root := t.tx.Bucket(bktHalfSched)
	err := root.ForEachBucket(func(k []byte) error {
		out[string(k)] = root.Bucket(k).Stats().KeyN
		return nil
	})
	return out, err
}

// CountState counts the half messages in a state (from the state index).
func (t *Tx) CountState(st storepb.HalfState) int {
	n := 0
	prefix := []byte{byte(st)}
	c := t.tx.Bucket(bktHalfState).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		n++
	}
	return n
}

// InState reports whether half message id is in state st (from the state
// index: no record is read).
func (t *Tx) InState(id string, st storepb.HalfState) bool {
	return t.tx.Bucket(bktHalfState).Get(stateKey(st, id)) != nil
}

// PendingIDs calls fn with the ID of each pending message of a producer
// group, in the order of their next check (from the schedule index: no
// record is read).
func (t *Tx) PendingIDs(group string, fn func(id string)) {
	b := t.tx.Bucket(bktHalfSched).Bucket([]byte(group))
	if b == nil {
		return
	}
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		fn(string(k[8:]))
	}
}

// FirstInState is the smallest message ID in a state.
func (t *Tx) FirstInState(st storepb.HalfState) (string, bool) {
	prefix := []byte{byte(st)}
	k, _ := t.tx.Bucket(bktHalfState).Cursor().Seek(prefix)
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return "", false
	}
	return string(k[1:]), true
}
