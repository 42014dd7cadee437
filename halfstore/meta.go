package halfstore

import (
	"encoding/binary"
)

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
