package halfstore

import (
	"bytes"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// The read side of half messages: records, the transaction index, the state
// index and the counts read from the indexes. Nothing here writes.

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

// HalfFilter selects half messages; a zero field matches every message.
type HalfFilter struct {
	Group string
	State storepb.HalfState
	Topic string
	TxID  string
	// CreatedBefore > 0: only messages created at or before it (Unix ns).
	CreatedBefore int64
}

func (f HalfFilter) match(h *storepb.Half) bool {
	return (f.Group == "" || h.ProducerGroup == f.Group) &&
		(f.State == storepb.HalfState_HALF_STATE_UNSPECIFIED || h.State == f.State) &&
		(f.Topic == "" || h.Topic == f.Topic) &&
		(f.TxID == "" || h.TransactionId == f.TxID) &&
		(f.CreatedBefore == 0 || h.CreatedAt <= f.CreatedBefore)
}

// ListHalf lists half messages in message ID order, after the given ID.
// group "" matches every producer group; state UNSPECIFIED every state.
func (t *Tx) ListHalf(group string, state storepb.HalfState, after string, limit int) ([]*storepb.Half, error) {
	return t.FindHalf(HalfFilter{Group: group, State: state}, after, limit)
}

// FindHalf lists up to limit half messages that f selects, in message ID
// order, after the given ID.
func (t *Tx) FindHalf(f HalfFilter, after string, limit int) ([]*storepb.Half, error) {
	var out []*storepb.Half
	if limit <= 0 {
		return nil, nil
	}
	err := t.eachHalf(f, after, func(h *storepb.Half) bool {
		out = append(out, h)
		return len(out) < limit
	})
	return out, err
}

// CountHalf counts the half messages that f selects: from the indexes
// when f names at most a state, else by reading the records it may
// select.
func (t *Tx) CountHalf(f HalfFilter) (int, error) {
	if f == (HalfFilter{State: f.State}) {
		if f.State == storepb.HalfState_HALF_STATE_UNSPECIFIED {
			return t.tx.Bucket(bktHalf).Stats().KeyN, nil
		}
		return t.CountState(f.State), nil
	}
	n := 0
	err := t.eachHalf(f, "", func(*storepb.Half) bool { n++; return true })
	return n, err
}

// eachHalf passes the half messages f selects, in message ID order after
// the given ID, to fn until it returns false. It reads the fewest records
// the indexes allow: one for a producer group and transaction ID, those of
// one state for a state.
func (t *Tx) eachHalf(f HalfFilter, after string, fn func(*storepb.Half) bool) error {
	if f.Group != "" && f.TxID != "" {
		id := t.tx.Bucket(bktHalfTx).Get(txKey(f.Group, f.TxID))
		if id == nil || string(id) <= after {
			return nil
		}
		h, err := t.Half(string(id))
		if err == nil && f.match(h) {
			fn(h)
		}
		return err
	}
	if f.State == storepb.HalfState_HALF_STATE_UNSPECIFIED {
		c := t.tx.Bucket(bktHalf).Cursor()
		k, v := c.Seek([]byte(after))
		if k != nil && string(k) == after {
			k, v = c.Next()
		}
		for ; k != nil; k, v = c.Next() {
			h := &storepb.Half{}
			if err := proto.Unmarshal(v, h); err != nil {
				return fmt.Errorf("halfstore: corrupt half message %q: %w", k, err)
			}
			if f.match(h) && !fn(h) {
				return nil
			}
		}
		return nil
	}
	prefix := []byte{byte(f.State)}
	c := t.tx.Bucket(bktHalfState).Cursor()
	k, _ := c.Seek(stateKey(f.State, after))
	if k != nil && string(k[1:]) == after {
		k, _ = c.Next()
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		h, err := t.Half(string(k[1:]))
		if err != nil {
			return err
		}
		if f.match(h) && !fn(h) {
			return nil
		}
	}
	return nil
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

// FirstInState is the smallest message ID in a state.
func (t *Tx) FirstInState(st storepb.HalfState) (string, bool) {
	prefix := []byte{byte(st)}
	k, _ := t.tx.Bucket(bktHalfState).Cursor().Seek(prefix)
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return "", false
	}
	return string(k[1:]), true
}
