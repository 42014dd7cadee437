package halfstore

import (
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// ---- consumer groups: progress ----

func (t *Tx) groupBucket(topic, group string) *bolt.Bucket {
	tb := t.topicBucket(topic)
	if tb == nil {
		return nil
	}
	return tb.Bucket(bktGroups).Bucket([]byte(group))
}

func groupNotFound(topic, group string) error {
	return fmt.Errorf("%w: consumer group %q on topic %q", ErrNotFound, group, topic)
}

// groupTx is one consumer group on one topic inside a transaction: its
// buckets and its topic's and its own metadata, saved by save.
type groupTx struct {
	t     *Tx
	topic string
	tb    *bolt.Bucket
	gb    *bolt.Bucket
	tp    *storepb.Topic
	g     *storepb.Group
}

func (t *Tx) openGroup(topic, group string) (*groupTx, error) {
	tb := t.topicBucket(topic)
	if tb == nil {
		return nil, groupNotFound(topic, group)
	}
	gb := tb.Bucket(bktGroups).Bucket([]byte(group))
	if gb == nil {
		return nil, groupNotFound(topic, group)
	}
	tp, err := topicMeta(tb)
	if err != nil {
		return nil, err
	}
	g, err := groupMeta(gb)
	if err != nil {
		return nil, err
	}
	return &groupTx{t: t, topic: topic, tb: tb, gb: gb, tp: tp, g: g}, nil
}

// sub returns a nested bucket of the group for writing. Groups created
// before a bucket existed get it on their first write.
func (gt *groupTx) sub(name []byte) (*bolt.Bucket, error) {
	if b := gt.gb.Bucket(name); b != nil {
		return b, nil
	}
	return gt.gb.CreateBucket(name)
}

// has reports whether a nested bucket of the group holds seq.
func (gt *groupTx) has(name []byte, seq uint64) bool {
	b := gt.gb.Bucket(name)
	return b != nil && b.Get(u64(seq)) != nil
}

func (gt *groupTx) save() (*storepb.Group, error) {
	return gt.g, put(gt.gb, keyMeta, gt.g)
}

func (gt *groupTx) acked(seq uint64) bool {
	return seq <= gt.g.AckedThrough || gt.has(bktAcked, seq)
}

// ackLog acks one log sequence and ends its retry state. The caller
// collapses afterwards.
func (gt *groupTx) ackLog(seq uint64) error {
	if gt.acked(seq) {
		return nil
	}
	acked, err := gt.sub(bktAcked)
	if err != nil {
		return err
	}
	if err := acked.Put(u64(seq), present); err != nil {
		return err
	}
	gt.g.AckedAbove++
	return gt.dropRetry(seq)
}

func (gt *groupTx) dropRetry(seq uint64) error {
	if !gt.has(bktRetry, seq) {
		return nil
	}
	gt.g.Retrying--
	return gt.gb.Bucket(bktRetry).Delete(u64(seq))
}

// collapse advances acked_through over every contiguous acked sequence;
// acks at or below it are not kept.
func (gt *groupTx) collapse() error {
	acked := gt.gb.Bucket(bktAcked)
	if acked == nil {
		return nil
	}
	for acked.Get(u64(gt.g.AckedThrough+1)) != nil {
		gt.g.AckedThrough++
		if err := acked.Delete(u64(gt.g.AckedThrough)); err != nil {
			return err
		}
		gt.g.AckedAbove--
	}
	return nil
}

// keysIn lists the sequence keys of a nested bucket in [lo, hi], at most
// limit (0: no limit), so that callers can delete them after the scan.
func (gt *groupTx) keysIn(name []byte, lo, hi uint64, limit int) ([]uint64, error) {
	b := gt.gb.Bucket(name)
	if b == nil {
		return nil, nil
	}
	var out []uint64
	c := b.Cursor()
	for k, _ := c.Seek(u64(lo)); k != nil && (limit == 0 || len(out) < limit); k, _ = c.Next() {
		if len(k) != 8 {
			return nil, fmt.Errorf("halfstore: corrupt key %x in %s of group %q on topic %q", k, name, gt.g.Name, gt.topic)
		}
		s := binary.BigEndian.Uint64(k)
		if s > hi {
			break
		}
		out = append(out, s)
	}
	return out, nil
}

// GroupStart says where a new group starts, or where a reset moves it.
type GroupStart struct {
	// Latest: after the last committed message.
	Latest bool
	// Time > 0: at the first retained message committed at or after Time
	// (Unix ns); after the last when there is none.
	Time int64
	// Neither: the earliest retained message.
}

func (s GroupStart) check() error {
	if s.Latest && s.Time != 0 {
		return fmt.Errorf("%w: start at the latest message or at a time, not both", ErrInvalid)
	}
	if s.Time < 0 {
		return fmt.Errorf("%w: start time %d is before 1970; give Unix nanoseconds", ErrInvalid, s.Time)
	}
	return nil
}

// startSeq is the first sequence a group at start gets. The log is
// searched by committed_at with a binary search: across leader changes the
// times are nearly, not strictly, monotonic, and the first sequence found at
// or after the time is close enough.
func startSeq(tb *bolt.Bucket, tp *storepb.Topic, start GroupStart) (uint64, error) {
	switch {
	case start.Latest:
		return tp.LastSequence + 1, nil
	case start.Time > 0:
		lo, hi := firstSeq(tp), tp.LastSequence+1
		log := tb.Bucket(bktLog)
		for lo < hi {
			mid := lo + (hi-lo)/2
			m := &storepb.Message{}
			found, err := get(log, u64(mid), m)
			if err != nil {
				return 0, err
			}
			if !found {
				return 0, fmt.Errorf("halfstore: topic %q: message %d is missing from the retained log", tp.Name, mid)
			}
			if m.CommittedAt >= start.Time {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return lo, nil
	}
	return firstSeq(tp), nil
}

// StartSeq is the first sequence a group at start would get (its
// acked_through would be StartSeq-1).
func (t *Tx) StartSeq(topic string, start GroupStart) (uint64, error) {
	if err := start.check(); err != nil {
		return 0, err
	}
	tb := t.topicBucket(topic)
	if tb == nil {
		return 0, fmt.Errorf("%w: topic %q", ErrNotFound, topic)
	}
	tp, err := topicMeta(tb)
	if err != nil {
		return 0, err
	}
	return startSeq(tb, tp, start)
}

// CreateGroup creates a consumer group on a topic, starting where start
// says. An existing group is returned unchanged with created = false.
func (t *Tx) CreateGroup(topic, group string, start GroupStart, now int64) (*storepb.Group, bool, error) {
	if err := checkName("consumer group", group); err != nil {
		return nil, false, err
	}
	if err := start.check(); err != nil {
		return nil, false, err
	}
	tb := t.topicBucket(topic)
	if tb == nil {
		return nil, false, fmt.Errorf("%w: topic %q", ErrNotFound, topic)
	}
	if gb := tb.Bucket(bktGroups).Bucket([]byte(group)); gb != nil {
		g, err := groupMeta(gb)
		return g, false, err
	}
	tp, err := topicMeta(tb)
	if err != nil {
		return nil, false, err
	}
	seq, err := startSeq(tb, tp, start)
	if err != nil {
		return nil, false, err
	}
	gb, err := tb.Bucket(bktGroups).CreateBucket([]byte(group))
	if err != nil {
		return nil, false, err
	}
	for _, sub := range [][]byte{bktAcked, bktRetry, bktDLQ, bktRedrive} {
		if _, err := gb.CreateBucket(sub); err != nil {
			return nil, false, err
		}
	}
	g := &storepb.Group{Topic: topic, Name: group, CreatedAt: now, AckedThrough: seq - 1}
	return g, true, put(gb, keyMeta, g)
}

func groupMeta(gb *bolt.Bucket) (*storepb.Group, error) {
	g := &storepb.Group{}
	if _, err := get(gb, keyMeta, g); err != nil {
		return nil, err
	}
	return g, nil
}

// Group returns a consumer group's progress on a topic.
func (t *Tx) Group(topic, group string) (*storepb.Group, error) {
	gb := t.groupBucket(topic, group)
	if gb == nil {
		return nil, groupNotFound(topic, group)
	}
	return groupMeta(gb)
}

// Groups lists the consumer groups of a topic in name order.
func (t *Tx) Groups(topic string) ([]*storepb.Group, error) {
	tb := t.topicBucket(topic)
	if tb == nil {
		return nil, fmt.Errorf("%w: topic %q", ErrNotFound, topic)
	}
	var out []*storepb.Group
	gs := tb.Bucket(bktGroups)
	err := gs.ForEachBucket(func(k []byte) error {
		g, err := groupMeta(gs.Bucket(k))
		if err != nil {
			return err
		}
		out = append(out, g)
		return nil
	})
	return out, err
}

// GroupTopics lists a consumer group's progress on every topic it consumes.
func (t *Tx) GroupTopics(group string) ([]*storepb.Group, error) {
	var out []*storepb.Group
	err := t.tx.Bucket(bktTopics).ForEachBucket(func(k []byte) error {
		gb := t.groupBucket(string(k), group)
		if gb == nil {
			return nil
		}
		g, err := groupMeta(gb)
		if err != nil {
			return err
		}
		out = append(out, g)
		return nil
	})
	return out, err
}

// ResetGroup moves a group to start: everything before it is acked,
// everything from it on is not, and retry state is cleared. Redriven dead
// letters the log will deliver again are dropped; the DLQ is kept.
func (t *Tx) ResetGroup(topic, group string, start GroupStart) (*storepb.Group, error) {
	if err := start.check(); err != nil {
		return nil, fmt.Errorf("halfstore: reset %s/%s: %w", topic, group, err)
	}
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	seq, err := startSeq(gt.tb, gt.tp, start)
	if err != nil {
		return nil, err
	}
	for _, name := range [][]byte{bktAcked, bktRetry} {
		if gt.gb.Bucket(name) != nil {
			if err := gt.gb.DeleteBucket(name); err != nil {
				return nil, err
			}
		}
		if _, err := gt.gb.CreateBucket(name); err != nil {
			return nil, err
		}
	}
	gt.g.AckedThrough = seq - 1
	gt.g.AckedAbove = 0
	gt.g.Retrying = 0
	again, err := gt.keysIn(bktRedrive, seq, ^uint64(0), 0)
	if err != nil {
		return nil, err
	}
	for _, s := range again {
		if err := gt.gb.Bucket(bktRedrive).Delete(u64(s)); err != nil {
			return nil, err
		}
		gt.g.Redriven--
	}
	return gt.save()
}

// Ack records acks of a consumer group: log sequences, and redriven dead
// letters (sequences in the group's "redrive" bucket). Acking an acked log
// sequence or an unknown redriven one changes nothing. Every log sequence
// must exist in the topic. acked_through advances over every contiguous
// acked sequence, acks below it are not kept, and an acked message's retry
// state is dropped.
func (t *Tx) Ack(topic, group string, seqs, redriven []uint64) (*storepb.Group, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	for _, s := range seqs {
		if s == 0 || s > gt.tp.LastSequence {
			return nil, fmt.Errorf("%w: sequence %d is not in topic %q (last is %d)", ErrInvalid, s, topic, gt.tp.LastSequence)
		}
	}
	for _, s := range seqs {
		if err := gt.ackLog(s); err != nil {
			return nil, err
		}
	}
	if err := gt.collapse(); err != nil {
		return nil, err
	}
	for _, s := range redriven {
		if !gt.has(bktRedrive, s) {
			continue
		}
		if err := gt.gb.Bucket(bktRedrive).Delete(u64(s)); err != nil {
			return nil, err
		}
		gt.g.Redriven--
	}
	return gt.save()
}

// AckedAbove returns the sequences acked above acked_through, in order.
func (t *Tx) AckedAbove(topic, group string) ([]uint64, error) {
	gb := t.groupBucket(topic, group)
	if gb == nil {
		return nil, groupNotFound(topic, group)
	}
	var out []uint64
	err := gb.Bucket(bktAcked).ForEach(func(k, _ []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("halfstore: corrupt ack key %x in group %q of topic %q", k, group, topic)
		}
		out = append(out, binary.BigEndian.Uint64(k))
		return nil
	})
	return out, err
}

// IsAcked reports whether a consumer group acked a sequence.
func (t *Tx) IsAcked(topic, group string, seq uint64) (bool, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return false, err
	}
	return gt.acked(seq), nil
}

// GroupLag is how far a group is behind on a topic.
type GroupLag struct {
	// Lag counts the unacked retained log messages and the redriven dead
	// letters not yet acked.
	Lag uint64
	// OldestUnacked is the committed_at of the oldest of those, 0 when Lag
	// is 0.
	OldestUnacked int64
}

// Lag computes a group's lag from its counters; finding the oldest message
// reads past the acks above acked_through and the first redriven entry
// (sequence order is commit order, nearly).
func (t *Tx) Lag(topic, group string) (GroupLag, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return GroupLag{}, err
	}
	var lag GroupLag
	through := max(gt.g.AckedThrough, firstSeq(gt.tp)-1)
	if last := gt.tp.LastSequence; last > through {
		if unacked := last - through; unacked > gt.g.AckedAbove {
			lag.Lag = unacked - gt.g.AckedAbove
		}
		s := through + 1
		for s <= last && gt.has(bktAcked, s) {
			s++
		}
		if s <= last {
			m, err := t.Message(topic, s)
			if err != nil {
				return GroupLag{}, err
			}
			lag.OldestUnacked = m.CommittedAt
		}
	}
	lag.Lag += gt.g.Redriven
	if b := gt.gb.Bucket(bktRedrive); b != nil {
		if k, v := b.Cursor().First(); k != nil {
			dl := &storepb.DeadLetter{}
			if err := proto.Unmarshal(v, dl); err != nil {
				return GroupLag{}, fmt.Errorf("halfstore: corrupt redriven letter %s/%s/%x: %w", topic, group, k, err)
			}
			if at := dl.GetMessage().GetCommittedAt(); lag.OldestUnacked == 0 || at < lag.OldestUnacked {
				lag.OldestUnacked = at
			}
		}
	}
	if lag.Lag == 0 {
		lag.OldestUnacked = 0
	}
	return lag, nil
}

// ---- consumer groups: delivery policy ----

// ConsumerGroup returns a consumer group's delivery policy; a group without
// one gets a record with only the name (all defaults).
func (t *Tx) ConsumerGroup(name string) (*storepb.ConsumerGroup, error) {
	cg := &storepb.ConsumerGroup{}
	found, err := get(t.tx.Bucket(bktCGroups), []byte(name), cg)
	if err != nil {
		return nil, err
	}
	if !found {
		cg.Name = name
	}
	return cg, nil
}

// PutConsumerGroup replaces a consumer group's delivery policy.
func (t *Tx) PutConsumerGroup(cg *storepb.ConsumerGroup) error {
	if err := checkName("consumer group", cg.Name); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("halfstore: consumer group %s: %w: %s", cg.Name, ErrInvalid, fmt.Sprintf(format, args...))
	}
	if cg.AckDeadline < 0 {
		return bad("ack deadline %d is negative", cg.AckDeadline)
	}
	for _, d := range cg.RedeliveryBackoff {
		if d < 0 {
			return bad("redelivery backoff %d is negative", d)
		}
	}
	if _, ok := storepb.OrderedPoison_name[int32(cg.OrderedPoison)]; !ok {
		return bad("ordered poison policy %d is not 0 (default), 1 (skip) or 2 (hold)", cg.OrderedPoison)
	}
	return put(t.tx.Bucket(bktCGroups), []byte(cg.Name), cg)
}

// ---- consumer groups: failures, dead letters, redrive ----

// Retry is the failure state of a log message, nil (and no error) when it
// never failed or is acked.
func (t *Tx) Retry(topic, group string, seq uint64) (*storepb.Retry, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	b := gt.gb.Bucket(bktRetry)
	if b == nil {
		return nil, nil
	}
	r := &storepb.Retry{}
	found, err := get(b, u64(seq), r)
	if err != nil || !found {
		return nil, err
	}
	return r, nil
}

// Failure is one delivery that ended without an ack (raftpb.Failure, which
// this package cannot import).
type Failure struct {
	Seq uint64
	// Redriven: the delivery was of a redriven dead letter (an entry in
	// "redrive"), not of the log message.
	Redriven bool
	// Attempts counts the failed deliveries so far, this one included.
	Attempts uint32
	// RetryAt is when it may be delivered again, Unix ns.
	RetryAt int64
	Error   string
	// Dead moves it to the DLQ.
	Dead bool
}

// RecordFailures applies failed deliveries of one group on one topic.
// Failures of messages acked (or gone) by now are skipped. A failure keeps
// the retry state (attempts, when, last error); a dead one moves the
// message to the DLQ, which acks the log sequence so that the group moves
// on. It returns the group and the dead letters created.
func (t *Tx) RecordFailures(topic, group string, fs []Failure, now int64) (*storepb.Group, []*storepb.DeadLetter, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range fs {
		switch {
		case f.Seq == 0:
			return nil, nil, fmt.Errorf("halfstore: record failures %s/%s: %w: sequence 0", topic, group, ErrInvalid)
		case !f.Redriven && f.Seq > gt.tp.LastSequence:
			return nil, nil, fmt.Errorf("halfstore: record failures %s/%s: %w: sequence %d is not in the topic (last is %d)", topic, group, ErrInvalid, f.Seq, gt.tp.LastSequence)
		case f.Attempts == 0:
			return nil, nil, fmt.Errorf("halfstore: record failures %s/%s: %w: sequence %d failed after 0 attempts", topic, group, ErrInvalid, f.Seq)
		}
	}
	var dead []*storepb.DeadLetter
	for _, f := range fs {
		fail := gt.failLog
		if f.Redriven {
			fail = gt.failRedriven
		}
		dl, err := fail(f, now)
		if err != nil {
			return nil, nil, err
		}
		if dl != nil {
			dead = append(dead, dl)
		}
	}
	if err := gt.collapse(); err != nil {
		return nil, nil, err
	}
	g, err := gt.save()
	if err != nil {
		return nil, nil, err
	}
	return g, dead, nil
}

func (gt *groupTx) failLog(f Failure, now int64) (*storepb.DeadLetter, error) {
	if gt.acked(f.Seq) {
		return nil, nil
	}
	m := &storepb.Message{}
	found, err := get(gt.tb.Bucket(bktLog), u64(f.Seq), m)
	if err != nil || !found {
		return nil, err
	}
	gt.g.Redeliveries++
	if !f.Dead {
		retry, err := gt.sub(bktRetry)
		if err != nil {
			return nil, err
		}
		if retry.Get(u64(f.Seq)) == nil {
			gt.g.Retrying++
		}
		return nil, put(retry, u64(f.Seq), &storepb.Retry{Attempts: f.Attempts, RetryAt: f.RetryAt, LastError: f.Error})
	}
	dl := &storepb.DeadLetter{
		Message:   m,
		Topic:     gt.topic,
		Group:     gt.g.Name,
		Attempts:  f.Attempts,
		LastError: f.Error,
		DeadAt:    now,
	}
	if err := gt.putDead(dl); err != nil {
		return nil, err
	}
	return dl, gt.ackLog(f.Seq)
}

func (gt *groupTx) failRedriven(f Failure, now int64) (*storepb.DeadLetter, error) {
	b := gt.gb.Bucket(bktRedrive)
	if b == nil {
		return nil, nil
	}
	dl := &storepb.DeadLetter{}
	found, err := get(b, u64(f.Seq), dl)
	if err != nil || !found {
		return nil, err
	}
	gt.g.Redeliveries++
	dl.Attempts = f.Attempts
	dl.LastError = f.Error
	if !f.Dead {
		dl.RetryAt = f.RetryAt
		return nil, put(b, u64(f.Seq), dl)
	}
	if err := b.Delete(u64(f.Seq)); err != nil {
		return nil, err
	}
	gt.g.Redriven--
	dl.RetryAt = 0
	dl.DeadAt = now
	return dl, gt.putDead(dl)
}

func dlqIDKey(group, messageID string) []byte {
	return []byte(group + "\x00" + messageID)
}

// putDead stores a dead letter in the DLQ and the ID index.
func (gt *groupTx) putDead(dl *storepb.DeadLetter) error {
	dlq, err := gt.sub(bktDLQ)
	if err != nil {
		return err
	}
	seq := dl.GetMessage().GetSequence()
	if dlq.Get(u64(seq)) == nil {
		gt.g.DeadLetters++
	}
	if err := put(dlq, u64(seq), dl); err != nil {
		return err
	}
	ref := append([]byte(gt.topic+"\x00"), u64(seq)...)
	return gt.t.tx.Bucket(bktDLQIDs).Put(dlqIDKey(gt.g.Name, dl.GetMessage().GetId()), ref)
}

// takeDead removes a dead letter from the DLQ and the ID index and returns
// it, nil when there is none.
func (gt *groupTx) takeDead(seq uint64) (*storepb.DeadLetter, error) {
	dlq := gt.gb.Bucket(bktDLQ)
	if dlq == nil {
		return nil, nil
	}
	dl := &storepb.DeadLetter{}
	found, err := get(dlq, u64(seq), dl)
	if err != nil || !found {
		return nil, err
	}
	if err := dlq.Delete(u64(seq)); err != nil {
		return nil, err
	}
	gt.g.DeadLetters--
	return dl, gt.t.tx.Bucket(bktDLQIDs).Delete(dlqIDKey(gt.g.Name, dl.GetMessage().GetId()))
}

// readLetters decodes up to limit entries of a nested bucket with sequence
// >= from, in order.
func (gt *groupTx) readLetters(name []byte, from uint64, limit int) ([]*storepb.DeadLetter, error) {
	b := gt.gb.Bucket(name)
	if b == nil {
		return nil, nil
	}
	var out []*storepb.DeadLetter
	c := b.Cursor()
	for k, v := c.Seek(u64(from)); k != nil && len(out) < limit; k, v = c.Next() {
		dl := &storepb.DeadLetter{}
		if err := proto.Unmarshal(v, dl); err != nil {
			return nil, fmt.Errorf("halfstore: corrupt dead letter %s/%s/%s/%x: %w", gt.topic, gt.g.Name, name, k, err)
		}
		out = append(out, dl)
	}
	return out, nil
}

func checkLimit(op, topic, group string, limit int) error {
	if limit <= 0 {
		return fmt.Errorf("halfstore: %s %s/%s: %w: limit must be > 0", op, topic, group, ErrInvalid)
	}
	return nil
}

// ReadRedriven returns redriven dead letters with sequence >= from, in
// order, at most limit.
func (t *Tx) ReadRedriven(topic, group string, from uint64, limit int) ([]*storepb.DeadLetter, error) {
	if err := checkLimit("read redriven", topic, group, limit); err != nil {
		return nil, err
	}
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	return gt.readLetters(bktRedrive, from, limit)
}

// DeadLetters lists the group's DLQ on a topic with sequence > after, in
// order, at most limit.
func (t *Tx) DeadLetters(topic, group string, after uint64, limit int) ([]*storepb.DeadLetter, error) {
	if err := checkLimit("list dead letters", topic, group, limit); err != nil {
		return nil, err
	}
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	if after == ^uint64(0) {
		return nil, nil
	}
	return gt.readLetters(bktDLQ, after+1, limit)
}

// DeadLetter returns one dead letter of a group on a topic.
func (t *Tx) DeadLetter(topic, group string, seq uint64) (*storepb.DeadLetter, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	dl := &storepb.DeadLetter{}
	found := false
	if b := gt.gb.Bucket(bktDLQ); b != nil {
		if found, err = get(b, u64(seq), dl); err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: dead letter %d of consumer group %q on topic %q", ErrNotFound, seq, group, topic)
	}
	return dl, nil
}

// DeadLetterByID finds a group's dead letter by message ID, on any topic.
func (t *Tx) DeadLetterByID(group, messageID string) (*storepb.DeadLetter, error) {
	ref := t.tx.Bucket(bktDLQIDs).Get(dlqIDKey(group, messageID))
	if ref == nil {
		return nil, fmt.Errorf("%w: message %q is not a dead letter of consumer group %q", ErrNotFound, messageID, group)
	}
	if len(ref) < 9 || ref[len(ref)-9] != 0 {
		return nil, fmt.Errorf("halfstore: corrupt dead letter index entry %x for %s/%s", ref, group, messageID)
	}
	return t.DeadLetter(string(ref[:len(ref)-9]), group, binary.BigEndian.Uint64(ref[len(ref)-8:]))
}

// DeadLetterKeys is the set of ordering keys with at least one dead letter
// in the group on the topic.
func (t *Tx) DeadLetterKeys(topic, group string) (map[string]bool, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	b := gt.gb.Bucket(bktDLQ)
	if b == nil {
		return out, nil
	}
	err = b.ForEach(func(k, v []byte) error {
		dl := &storepb.DeadLetter{}
		if err := proto.Unmarshal(v, dl); err != nil {
			return fmt.Errorf("halfstore: corrupt dead letter %s/%s/%x: %w", topic, group, k, err)
		}
		if key := dl.GetMessage().GetOrderingKey(); key != "" {
			out[key] = true
		}
		return nil
	})
	return out, err
}

// selectDead picks DLQ entries: the given sequences that are in the DLQ
// (each once, in order), or with all the first limit of them.
func (gt *groupTx) selectDead(op string, seqs []uint64, all bool, limit int) ([]uint64, error) {
	if !all {
		out := []uint64{}
		for _, s := range seqs {
			if gt.has(bktDLQ, s) {
				out = append(out, s)
			}
		}
		slices.Sort(out)
		return slices.Compact(out), nil
	}
	if len(seqs) > 0 {
		return nil, fmt.Errorf("halfstore: %s %s/%s: %w: give sequences or all, not both", op, gt.topic, gt.g.Name, ErrInvalid)
	}
	if err := checkLimit(op, gt.topic, gt.g.Name, limit); err != nil {
		return nil, err
	}
	return gt.keysIn(bktDLQ, 0, ^uint64(0), limit)
}

// Redrive moves dead letters (the given sequences, or with all the first
// limit of them) back to the group, in "redrive", with attempts and
// retry_at reset and the last error kept. Sequences not in the DLQ are
// ignored. It returns the moved entries.
func (t *Tx) Redrive(topic, group string, seqs []uint64, all bool, limit int) ([]*storepb.DeadLetter, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	sel, err := gt.selectDead("redrive", seqs, all, limit)
	if err != nil {
		return nil, err
	}
	out := []*storepb.DeadLetter{}
	if len(sel) == 0 {
		return out, nil
	}
	rb, err := gt.sub(bktRedrive)
	if err != nil {
		return nil, err
	}
	for _, s := range sel {
		dl, err := gt.takeDead(s)
		if err != nil {
			return nil, err
		}
		dl.Attempts = 0
		dl.RetryAt = 0
		if rb.Get(u64(s)) == nil {
			gt.g.Redriven++
		}
		if err := put(rb, u64(s), dl); err != nil {
			return nil, err
		}
		out = append(out, dl)
	}
	_, err = gt.save()
	return out, err
}

// PurgeDeadLetters deletes dead letters (selected as by Redrive) and
// returns how many.
func (t *Tx) PurgeDeadLetters(topic, group string, seqs []uint64, all bool, limit int) (int, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return 0, err
	}
	sel, err := gt.selectDead("purge dead letters", seqs, all, limit)
	if err != nil || len(sel) == 0 {
		return 0, err
	}
	for _, s := range sel {
		if _, err := gt.takeDead(s); err != nil {
			return 0, err
		}
	}
	_, err = gt.save()
	return len(sel), err
}
