package halfstore

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

func due(t *testing.T, s *Store, group string, now int64, skip func(string) bool) []string {
	t.Helper()
	var ids []string
	view(t, s, func(tx *Tx) error {
		hs, err := tx.DueHalf(group, now, skip, nil, 100)
		require.NoError(t, err)
		for _, h := range hs {
			ids = append(ids, h.Id)
		}
		return nil
	})
	return ids
}

func scheduledGroups(t *testing.T, s *Store) []string {
	t.Helper()
	var gs []string
	view(t, s, func(tx *Tx) error {
		var err error
		gs, err = tx.ScheduledGroups()
		return err
	})
	return gs
}

func TestScheduleFollowsTheLifecycle(t *testing.T) {
	s := openStore(t)
	a := half("a", "shop", "ta")
	b := half("b", "shop", "tb")
	b.CheckAfter = 10 * sec
	c := half("c", "billing", "tc")
	for _, h := range []*storepb.Half{a, b, c} {
		putHalf(t, s, h)
	}
	require.Equal(t, []string{"billing", "shop"}, scheduledGroups(t, s))
	require.Empty(t, due(t, s, "shop", t0+5*sec, nil), "nothing is due before check_after")
	require.Equal(t, []string{"a"}, due(t, s, "shop", t0+6*sec, nil))
	require.Equal(t, []string{"a", "b"}, due(t, s, "shop", t0+10*sec, nil))
	require.Equal(t, []string{"b"}, due(t, s, "shop", t0+10*sec, func(id string) bool { return id == "a" }))
	view(t, s, func(tx *Tx) error {
		at, ok := tx.NextCheck("shop")
		require.True(t, ok)
		require.Equal(t, t0+6*sec, at)
		return nil
	})

	// An unanswered check that reached a producer uses an attempt and
	// moves the message later; one that did not reach uses none.
	update(t, s, func(tx *Tx) error {
		h, err := tx.RecordCheck("a", true, "timeout", t0+20*sec)
		require.NoError(t, err)
		require.Equal(t, uint32(1), h.CheckAttempts)
		require.Equal(t, "timeout", h.LastCheckError)
		h, err = tx.RecordCheck("a", false, "no producer instance", t0+30*sec)
		require.NoError(t, err)
		require.Equal(t, uint32(1), h.CheckAttempts)
		return nil
	})
	require.Equal(t, []string{"b"}, due(t, s, "shop", t0+20*sec, nil))
	require.Equal(t, []string{"b", "a"}, due(t, s, "shop", t0+30*sec, nil))
	require.Equal(t, t0+30*sec, getHalf(t, s, "a").NextCheckAt)

	// Resolved and expired messages leave the schedule; an empty group
	// leaves the list of scheduled groups.
	_, err := resolve(t, s, "a", Commit, storepb.Source_SOURCE_CHECKBACK, t0+31*sec)
	require.NoError(t, err)
	_, err = expire(t, s, "b", t0+31*sec)
	require.NoError(t, err)
	require.Empty(t, due(t, s, "shop", t0+100*sec, nil))
	require.Equal(t, []string{"billing"}, scheduledGroups(t, s))

	// A check recorded after the message was resolved changes nothing.
	update(t, s, func(tx *Tx) error {
		_, err := tx.RecordCheck("a", true, "late", t0+40*sec)
		require.ErrorIs(t, err, ErrConflict)
		return nil
	})
	require.Equal(t, "no producer instance", getHalf(t, s, "a").LastCheckError)
	require.Equal(t, []string{"billing"}, scheduledGroups(t, s))
}

func TestExpireWithRollback(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("a", "shop", "ta"))
	update(t, s, func(tx *Tx) error {
		h, _, err := tx.Expire("a", t0+sec, true)
		require.NoError(t, err)
		require.Equal(t, storepb.HalfState_HALF_STATE_ROLLED_BACK, h.State)
		require.Equal(t, storepb.Source_SOURCE_EXPIRY, h.ResolutionSource)
		require.Empty(t, h.Body)
		return nil
	})
	require.Empty(t, scheduledGroups(t, s))
	_, err := resolve(t, s, "a", Commit, storepb.Source_SOURCE_OPERATOR, t0+2*sec)
	require.ErrorIs(t, err, ErrConflict, "a rolled-back message stays rolled back")
}

func TestProducerGroupPolicy(t *testing.T) {
	s := openStore(t)
	view(t, s, func(tx *Tx) error {
		pg, err := tx.ProducerGroup("shop")
		require.NoError(t, err)
		require.Equal(t, "shop", pg.Name)
		require.Zero(t, pg.MaxChecks, "no policy: defaults")
		return nil
	})
	update(t, s, func(tx *Tx) error {
		return tx.PutProducerGroup(&storepb.ProducerGroup{Name: "shop", MaxChecks: 3, ExpiryAction: storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK})
	})
	s = reopen(t, s)
	view(t, s, func(tx *Tx) error {
		pg, err := tx.ProducerGroup("shop")
		require.NoError(t, err)
		require.Equal(t, uint32(3), pg.MaxChecks)
		require.Equal(t, storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK, pg.ExpiryAction)
		require.ErrorIs(t, tx.PutProducerGroup(&storepb.ProducerGroup{}), ErrInvalid)
		return nil
	})
}

// 100,000 pending messages of which 1,000 are due: finding the due ones
// costs what is due, not what is pending.
func BenchmarkDueHalf(b *testing.B) {
	s := openStore(b)
	const pending, dueN = 100_000, 1_000
	for start := 0; start < pending; start += 5000 {
		update(b, s, func(tx *Tx) error {
			for i := start; i < start+5000; i++ {
				h := half(fmtID(i), "shop", fmtID(i))
				h.CheckAfter = 6 * sec
				if i >= dueN {
					h.CheckAfter = 3600 * sec
				}
				if _, _, err := tx.PutHalf(h, true); err != nil {
					return err
				}
			}
			return nil
		})
	}
	// Side by side: the schedule index, and a scan of every pending
	// message filtered by next check time (what the index saves).
	b.Run("index", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			var n int
			view(b, s, func(tx *Tx) error {
				hs, err := tx.DueHalf("shop", t0+10*sec, nil, nil, 10*dueN)
				n = len(hs)
				return err
			})
			if n != dueN {
				b.Fatalf("got %d due, want %d", n, dueN)
			}
		}
	})
	b.Run("scan-all-pending", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			n := 0
			view(b, s, func(tx *Tx) error {
				hs, err := tx.ListHalf("shop", storepb.HalfState_HALF_STATE_PENDING, "", 10*pending)
				for _, h := range hs {
					if h.NextCheckAt <= t0+10*sec {
						n++
					}
				}
				return err
			})
			if n != dueN {
				b.Fatalf("got %d due, want %d", n, dueN)
			}
		}
	})
}

func fmtID(i int) string { return fmt.Sprintf("m%07d", i) }

// InState and PendingIDs read the indexes: a message is in one state, and
// PendingIDs lists a group's pending messages only.
func TestInStateAndPendingIDs(t *testing.T) {
	s := openStore(t)
	for _, id := range []string{"a", "b", "c"} {
		putHalf(t, s, half(id, "shop", "tx-"+id))
	}
	putHalf(t, s, half("d", "other", "tx-d"))
	_, err := resolve(t, s, "b", Commit, storepb.Source_SOURCE_PRODUCER, 5)
	require.NoError(t, err)
	view(t, s, func(tx *Tx) error {
		require.True(t, tx.InState("a", storepb.HalfState_HALF_STATE_PENDING))
		require.False(t, tx.InState("b", storepb.HalfState_HALF_STATE_PENDING))
		require.True(t, tx.InState("b", storepb.HalfState_HALF_STATE_COMMITTED))
		require.False(t, tx.InState("zz", storepb.HalfState_HALF_STATE_PENDING))
		var got []string
		tx.PendingIDs("shop", func(id []byte) { got = append(got, string(id)) })
		require.ElementsMatch(t, []string{"a", "c"}, got)
		got = nil
		tx.PendingIDs("nobody", func(id []byte) { got = append(got, string(id)) })
		require.Empty(t, got)
		return nil
	})
}
