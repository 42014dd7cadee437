package halfstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// TrimPoint is the largest sequence retention should drop now, 0 when
// nothing is due. From the oldest retained message on, at most limit
// messages are looked at; a message is due when it was committed before
// before, or (maxBytes > 0) while the retained log is over maxBytes. The
// first message that is not due ends the scan, so the point is a prefix.
func (t *Tx) TrimPoint(topic string, before int64, maxBytes uint64, limit int) (uint64, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("halfstore: trim point %s: %w: limit must be > 0", topic, ErrInvalid)
	}
	tb, tp, err := t.topicWithMeta(topic)
	if err != nil {
		return 0, err
	}
	var point uint64
	size := tp.Bytes
	c := tb.Bucket(bktLog).Cursor()
	n := 0
	for k, v := c.Seek(u64(tp.FirstSequence)); k != nil && n < limit; k, v = c.Next() {
		m, err := decodeMessage(topic, k, v)
		if err != nil {
			return 0, err
		}
		if m.CommittedAt >= before && (maxBytes == 0 || size <= maxBytes) {
			break
		}
		point = m.Sequence
		size -= min(size, uint64(len(v)))
		n++
	}
	return point, nil
}

// Trim drops the oldest messages of a topic, up to and including through,
// at most limit of them, and returns how many it dropped. Every group of
// the topic moves past them: those it had not acked count as dropped, and
// its acks and retry state at or below its new acked_through go.
func (t *Tx) Trim(topic string, through uint64, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("halfstore: trim %s: %w: limit must be > 0", topic, ErrInvalid)
	}
	tb, tp, err := t.topicWithMeta(topic)
	if err != nil {
		return 0, err
	}
	first := tp.FirstSequence
	end := min(through, tp.LastSequence, first+uint64(limit)-1)
	if end < first {
		return 0, nil
	}
	log := tb.Bucket(bktLog)
	n := 0
	for s := first; s <= end; s++ {
		v := log.Get(u64(s))
		if v == nil {
			continue
		}
		tp.Bytes -= min(tp.Bytes, uint64(len(v)))
		if err := log.Delete(u64(s)); err != nil {
			return 0, err
		}
		n++
	}
	tp.FirstSequence = end + 1
	if err := put(tb, keyMeta, tp); err != nil {
		return 0, err
	}
	var names []string
	err = tb.Bucket(bktGroups).ForEachBucket(func(k []byte) error {
		names = append(names, string(k))
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, name := range names {
		gt, err := t.openGroup(topic, name)
		if err != nil {
			return 0, err
		}
		if err := gt.trimmed(first, end); err != nil {
			return 0, err
		}
	}
	return n, nil
}

// trimmed moves the group past the dropped sequences first..end.
func (gt *groupTx) trimmed(first, end uint64) error {
	g := gt.g
	if g.AckedThrough >= end {
		return nil
	}
	acks, err := gt.keysIn(bktAcked, 0, end, 0)
	if err != nil {
		return err
	}
	lo := max(first, g.AckedThrough+1)
	dropped := end - lo + 1
	for _, s := range acks {
		if s >= lo {
			dropped--
		}
		if err := gt.gb.Bucket(bktAcked).Delete(u64(s)); err != nil {
			return err
		}
		g.AckedAbove--
	}
	g.Dropped += dropped
	g.AckedThrough = end
	if err := gt.collapse(); err != nil {
		return err
	}
	retries, err := gt.keysIn(bktRetry, 0, g.AckedThrough, 0)
	if err != nil {
		return err
	}
	for _, s := range retries {
		if err := gt.dropRetry(s); err != nil {
			return err
		}
	}
	_, err = gt.save()
	return err
}

// Prune deletes at most limit resolved half messages (COMMITTED or
// ROLLED_BACK) resolved before resolvedBefore, with their index entries,
// and at most limit Send dedup keys sent before dedupBefore. Parked
// (EXPIRED) half messages are never pruned: they wait for an operator.
func (t *Tx) Prune(resolvedBefore, dedupBefore int64, limit int) (halves, dedups int, err error) {
	if limit <= 0 {
		return 0, 0, fmt.Errorf("halfstore: prune: %w: limit must be > 0", ErrInvalid)
	}
	resolved, err := dueKeys(t.tx.Bucket(bktHalfRes), resolvedBefore, limit)
	if err != nil {
		return 0, 0, err
	}
	for _, k := range resolved {
		pruned, err := t.pruneHalf(string(k[8:]))
		if err != nil {
			return 0, 0, err
		}
		if pruned {
			halves++
		}
		if err := t.tx.Bucket(bktHalfRes).Delete(k); err != nil {
			return 0, 0, err
		}
	}
	sent, err := dueKeys(t.tx.Bucket(bktDedupTime), dedupBefore, limit)
	if err != nil {
		return 0, 0, err
	}
	for _, k := range sent {
		dk := k[8:]
		d := &storepb.Dedup{}
		found, err := get(t.tx.Bucket(bktDedup), dk, d)
		if err != nil {
			return 0, 0, err
		}
		// A key sent again later has a newer record (and time entry).
		if found && uint64(d.SentAt) == binary.BigEndian.Uint64(k[:8]) {
			if err := t.tx.Bucket(bktDedup).Delete(dk); err != nil {
				return 0, 0, err
			}
			dedups++
		}
		if err := t.tx.Bucket(bktDedupTime).Delete(k); err != nil {
			return 0, 0, err
		}
	}
	return halves, dedups, nil
}

// dueKeys collects up to limit keys (time BE | rest) of a time-ordered
// index with a time before before, so that they can be deleted after the
// scan.
func dueKeys(b *bolt.Bucket, before int64, limit int) ([][]byte, error) {
	var out [][]byte
	c := b.Cursor()
	for k, _ := c.First(); k != nil && len(out) < limit; k, _ = c.Next() {
		if len(k) < 8 {
			return nil, fmt.Errorf("halfstore: corrupt time index key %x", k)
		}
		if int64(binary.BigEndian.Uint64(k[:8])) >= before {
			break
		}
		out = append(out, bytes.Clone(k))
	}
	return out, nil
}

// pruneHalf deletes a resolved half message and its index entries. Only
// COMMITTED and ROLLED_BACK ones go.
func (t *Tx) pruneHalf(id string) (bool, error) {
	h, err := t.Half(id)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if h.State != storepb.HalfState_HALF_STATE_COMMITTED && h.State != storepb.HalfState_HALF_STATE_ROLLED_BACK {
		return false, nil
	}
	tk := txKey(h.ProducerGroup, h.TransactionId)
	if bytes.Equal(t.tx.Bucket(bktHalfTx).Get(tk), []byte(id)) {
		if err := t.tx.Bucket(bktHalfTx).Delete(tk); err != nil {
			return false, err
		}
	}
	if err := t.tx.Bucket(bktHalfState).Delete(stateKey(h.State, id)); err != nil {
		return false, err
	}
	return true, t.tx.Bucket(bktHalf).Delete([]byte(id))
}

// PruneDue reports whether Prune with these bounds would find anything, so
// that an idle leader does not write an empty Prune entry every round.
func (t *Tx) PruneDue(resolvedBefore, dedupBefore int64) bool {
	due := func(b *bolt.Bucket, before int64) bool {
		k, _ := b.Cursor().First()
		return len(k) >= 8 && int64(binary.BigEndian.Uint64(k[:8])) < before
	}
	return due(t.tx.Bucket(bktHalfRes), resolvedBefore) || due(t.tx.Bucket(bktDedupTime), dedupBefore)
}
