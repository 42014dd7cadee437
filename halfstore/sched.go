package halfstore

import (
	"encoding/binary"
	"fmt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// The check schedule (half_sched/<producer group>): pending messages by
// when their next check is due, so that finding what is due is a range scan
// whose cost follows what is due, not what is pending.

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

// PendingIDs calls fn with the ID of each pending message of a producer
// group, in the order of their next check (from the schedule index: no
// record is read). id is only valid during the call: a scrape of the
// metrics walks every pending message, so nothing is copied for it.
func (t *Tx) PendingIDs(group string, fn func(id []byte)) {
	b := t.tx.Bucket(bktHalfSched).Bucket([]byte(group))
	if b == nil {
		return
	}
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		fn(k[8:])
	}
}
