package halfstore

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Consumer group progress on a topic (topics/<name>/groups/<group>: meta
// and acked): creation and start positions, acks, reset and lag.

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

// has reports whether a nested bucket of the group holds seq.
func (gt *groupTx) has(name []byte, seq uint64) bool {
	return gt.gb.Bucket(name).Get(u64(seq)) != nil
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
	if err := gt.gb.Bucket(bktAcked).Put(u64(seq), present); err != nil {
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
	var out []uint64
	c := gt.gb.Bucket(name).Cursor()
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
		lo, hi := tp.FirstSequence, tp.LastSequence+1
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
	return tp.FirstSequence, nil
}

// StartSeq is the first sequence a group at start would get (its
// acked_through would be StartSeq-1).
func (t *Tx) StartSeq(topic string, start GroupStart) (uint64, error) {
	if err := start.check(); err != nil {
		return 0, err
	}
	tb, tp, err := t.topicWithMeta(topic)
	if err != nil {
		return 0, err
	}
	return startSeq(tb, tp, start)
}

// CreateGroup creates a consumer group on a topic, starting where start
// says; auto marks one a subscription created. An existing group is
// returned unchanged with created = false.
func (t *Tx) CreateGroup(topic, group string, start GroupStart, now int64, auto bool) (*storepb.Group, bool, error) {
	if err := checkName("consumer group", group); err != nil {
		return nil, false, err
	}
	if err := start.check(); err != nil {
		return nil, false, err
	}
	tb, err := t.existingTopic(topic)
	if err != nil {
		return nil, false, err
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
	g := &storepb.Group{Topic: topic, Name: group, CreatedAt: now, AckedThrough: seq - 1, AutoCreated: auto}
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
	tb, err := t.existingTopic(topic)
	if err != nil {
		return nil, err
	}
	var out []*storepb.Group
	gs := tb.Bucket(bktGroups)
	err = gs.ForEachBucket(func(k []byte) error {
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
		if err := gt.gb.DeleteBucket(name); err != nil {
			return nil, err
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
	through := max(gt.g.AckedThrough, gt.tp.FirstSequence-1)
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
	if k, v := gt.gb.Bucket(bktRedrive).Cursor().First(); k != nil {
		dl := &storepb.DeadLetter{}
		if err := proto.Unmarshal(v, dl); err != nil {
			return GroupLag{}, fmt.Errorf("halfstore: corrupt redriven letter %s/%s/%x: %w", topic, group, k, err)
		}
		if at := dl.GetMessage().GetCommittedAt(); lag.OldestUnacked == 0 || at < lag.OldestUnacked {
			lag.OldestUnacked = at
		}
	}
	if lag.Lag == 0 {
		lag.OldestUnacked = 0
	}
	return lag, nil
}
