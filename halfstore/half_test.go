package halfstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Resolve and Expire report whether they changed the message, and when
// they say they did not, the store is byte for byte as it was.
func TestTransitionsReportChanged(t *testing.T) {
	s := openStore(t)
	for _, id := range []string{"a", "b", "c", "d"} {
		putHalf(t, s, half(id, "pg", "tx-"+id))
	}
	type step struct {
		name    string
		run     func(tx *Tx) (*storepb.Half, bool, error)
		changed bool
		state   storepb.HalfState
		err     error
	}
	res := func(id string, r Resolution, src storepb.Source) func(tx *Tx) (*storepb.Half, bool, error) {
		return func(tx *Tx) (*storepb.Half, bool, error) { return tx.Resolve(id, r, src, t0+sec) }
	}
	exp := func(id string, rollback bool) func(tx *Tx) (*storepb.Half, bool, error) {
		return func(tx *Tx) (*storepb.Half, bool, error) { return tx.Expire(id, t0+sec, rollback) }
	}
	steps := []step{
		{"commit a", res("a", Commit, byProducer), true, committed, nil},
		{"commit a again", res("a", Commit, byCheckback), false, committed, nil},
		{"roll back a", res("a", Rollback, byOperator), false, committed, ErrConflict},
		{"expire a", exp("a", false), false, committed, ErrConflict},
		{"expire b", exp("b", false), true, expired, nil},
		{"expire b again", exp("b", true), false, expired, nil},
		{"commit b by a producer", res("b", Commit, byProducer), false, expired, ErrExpired},
		{"roll back b by an operator", res("b", Rollback, byOperator), true, rolledBack, nil},
		{"roll back b again", res("b", Rollback, byProducer), false, rolledBack, nil},
		{"expire c with rollback", exp("c", true), true, rolledBack, nil},
		{"roll back d", res("d", Rollback, byCheckback), true, rolledBack, nil},
		{"commit d", res("d", Commit, byProducer), false, rolledBack, ErrConflict},
	}
	for _, st := range steps {
		before := dump(t, s)
		var h *storepb.Half
		var changed bool
		var err error
		update(t, s, func(tx *Tx) error {
			h, changed, err = st.run(tx)
			return nil
		})
		if st.err == nil {
			require.NoError(t, err, st.name)
		} else {
			require.ErrorIs(t, err, st.err, st.name)
		}
		require.Equal(t, st.changed, changed, st.name)
		require.Equal(t, StateName(st.state), StateName(h.State), st.name)
		if !changed {
			require.Equal(t, before, dump(t, s), "%s reported no change but wrote", st.name)
		} else {
			require.NotEqual(t, before, dump(t, s), "%s reported a change but wrote nothing", st.name)
		}
	}
	var changed bool
	var err error
	update(t, s, func(tx *Tx) error {
		_, changed, err = tx.Resolve("nope", Commit, byProducer, t0)
		return nil
	})
	require.ErrorIs(t, err, ErrNotFound)
	require.False(t, changed)
}
