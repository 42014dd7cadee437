package halfstore

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

// FindHalf and CountHalf against a model: every filter combination over a
// random mix of groups, topics, ages and states selects what filtering the
// whole list selects, in ID order, and counts it, paged or not.
func TestFindHalfFilters(t *testing.T) {
	s := openStore(t)
	r := rand.New(rand.NewPCG(3, 4))
	var all []*storepb.Half
	first := map[string]*storepb.Half{} // group/tx -> the message it names
	for i := range 40 {
		h := half(fmt.Sprintf("m%02d", i), []string{"pg-a", "pg-b"}[r.IntN(2)], fmt.Sprintf("tx-%d", i%7))
		h.Topic = []string{"orders", "refunds"}[r.IntN(2)]
		h.CreatedAt = t0 + int64(r.IntN(10))*sec
		if f, ok := first[h.ProducerGroup+"/"+h.TransactionId]; ok {
			// A retry of the transaction: the same topic and body.
			h.Topic, h.Body = f.Topic, f.Body
		} else {
			first[h.ProducerGroup+"/"+h.TransactionId] = h
		}
		if _, dup := putHalf(t, s, h); dup {
			continue
		}
		switch r.IntN(3) {
		case 1:
			_, err := resolve(t, s, h.Id, Commit, storepb.Source_SOURCE_PRODUCER, t0+20*sec)
			require.NoError(t, err)
		case 2:
			_, err := expire(t, s, h.Id, t0+20*sec)
			require.NoError(t, err)
		}
		all = append(all, getHalf(t, s, h.Id))
	}
	var filters []HalfFilter
	for _, g := range []string{"", "pg-a"} {
		for _, st := range []storepb.HalfState{anyState, pending, storepb.HalfState_HALF_STATE_EXPIRED} {
			for _, topic := range []string{"", "refunds"} {
				for _, tx := range []string{"", "tx-3"} {
					for _, before := range []int64{0, t0 + 4*sec} {
						filters = append(filters, HalfFilter{Group: g, State: st, Topic: topic, TxID: tx, CreatedBefore: before})
					}
				}
			}
		}
	}
	for _, f := range filters {
		want := []string{}
		for _, h := range all {
			if f.match(h) {
				want = append(want, h.Id)
			}
		}
		got, paged := []string{}, []string{}
		view(t, s, func(tx *Tx) error {
			hs, err := tx.FindHalf(f, "", 1000)
			require.NoError(t, err)
			got = ids(hs)
			for after := ""; ; {
				page, err := tx.FindHalf(f, after, 3)
				require.NoError(t, err)
				if len(page) == 0 {
					break
				}
				paged = append(paged, ids(page)...)
				after = page[len(page)-1].Id
			}
			n, err := tx.CountHalf(f)
			require.NoError(t, err)
			require.Equal(t, len(want), n, "count %+v", f)
			return nil
		})
		require.Equal(t, want, got, "%+v", f)
		require.Equal(t, want, paged, "paged %+v", f)
	}
}

// KeyMessages reads at most its budget and says where to go on;
// MessageInWindow finds an ID only among the messages committed in its
// window.
func TestTopicLogLookups(t *testing.T) {
	s := openStore(t)
	for i := range 10 {
		send(t, s, "orders", fmt.Sprintf("m%d", i), []string{"a", "b"}[i%2], 0, t0+int64(i)*sec)
	}
	var scans []KeyScan
	view(t, s, func(tx *Tx) error {
		for from := uint64(1); ; {
			scan, err := tx.KeyMessages("orders", "a", from, 100, 4)
			require.NoError(t, err)
			scans = append(scans, scan)
			if scan.Next == 0 {
				break
			}
			from = scan.Next
		}
		limited, err := tx.KeyMessages("orders", "b", 1, 2, 100)
		require.NoError(t, err)
		require.Equal(t, []string{"m1", "m3"}, ids(limited.Found))
		require.Equal(t, uint64(5), limited.Next)

		m, err := tx.MessageInWindow("orders", "m4", t0+3*sec, t0+5*sec)
		require.NoError(t, err)
		require.Equal(t, uint64(5), m.Sequence)
		_, err = tx.MessageInWindow("orders", "m4", t0+5*sec, t0+9*sec)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.MessageInWindow("orders", "m8", t0, t0+7*sec)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.KeyMessages("nosuch", "a", 1, 1, 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
	require.Len(t, scans, 3)
	require.Equal(t, []string{"m0", "m2"}, ids(scans[0].Found))
	require.Equal(t, []string{"m4", "m6"}, ids(scans[1].Found))
	require.Equal(t, []string{"m8"}, ids(scans[2].Found))
	require.Equal(t, []int{4, 4, 2}, []int{scans[0].Read, scans[1].Read, scans[2].Read})
}
