package halfstore

import (
	"encoding/binary"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// A consumer group's failed deliveries (retry), its dead-letter queue (dlq,
// indexed by message ID in dlq_ids) and redriven dead letters (redrive).

// Retry is the failure state of a log message, nil (and no error) when it
// never failed or is acked.
func (t *Tx) Retry(topic, group string, seq uint64) (*storepb.Retry, error) {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return nil, err
	}
	r := &storepb.Retry{}
	found, err := get(gt.gb.Bucket(bktRetry), u64(seq), r)
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
		retry := gt.gb.Bucket(bktRetry)
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

// putDead stores a dead letter in the DLQ and the ID index.
func (gt *groupTx) putDead(dl *storepb.DeadLetter) error {
	dlq := gt.gb.Bucket(bktDLQ)
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
	var out []*storepb.DeadLetter
	c := gt.gb.Bucket(name).Cursor()
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
	found, err := get(gt.gb.Bucket(bktDLQ), u64(seq), dl)
	if err != nil {
		return nil, err
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
	err = gt.eachDead(func(dl *storepb.DeadLetter) error {
		if key := dl.GetMessage().GetOrderingKey(); key != "" {
			out[key] = true
		}
		return nil
	})
	return out, err
}

// eachDead calls fn with every dead letter in the group's DLQ, in order;
// fn must not change the bucket.
func (gt *groupTx) eachDead(fn func(*storepb.DeadLetter) error) error {
	return gt.gb.Bucket(bktDLQ).ForEach(func(k, v []byte) error {
		dl := &storepb.DeadLetter{}
		if err := proto.Unmarshal(v, dl); err != nil {
			return fmt.Errorf("halfstore: corrupt dead letter %s/%s/%x: %w", gt.topic, gt.g.Name, k, err)
		}
		return fn(dl)
	})
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
	rb := gt.gb.Bucket(bktRedrive)
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
