package broker

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

// putHalves stores pending half messages of group, one created at each of
// at, with IDs as the broker makes them, and returns their IDs.
func putHalves(t testing.TB, s *halfstore.Store, group string, at ...time.Time) []string {
	t.Helper()
	ids := newIDGen()
	var out []string
	require.NoError(t, s.Update(func(tx *halfstore.Tx) error {
		for _, created := range at {
			id := ids.next(created)
			h := &storepb.Half{Id: id, Topic: "orders", ProducerGroup: group, TransactionId: "tx-" + id,
				Body: []byte("x"), CreatedAt: created.UnixNano(), CheckAfter: int64(time.Hour)}
			if _, _, err := tx.PutHalf(h, true); err != nil {
				return err
			}
			out = append(out, id)
		}
		return nil
	}))
	return out
}

// readHalfGroups counts every pending message, ages those whose ID carries
// the leader's clock, strictly older than each age, and leaves resolved
// ones out.
func TestReadHalfGroups(t *testing.T) {
	s, err := halfstore.Open(filepath.Join(t.TempDir(), "fsm.db"))
	require.NoError(t, err)
	defer s.Close()
	now := time.UnixMilli(1_800_000_000_000)
	putHalves(t, s, "shop", now.Add(-2*time.Hour), now.Add(-time.Minute), now.Add(-time.Minute-time.Millisecond), now)
	resolved := putHalves(t, s, "shop", now.Add(-3*time.Hour))
	putHalves(t, s, "bank", now.Add(-5*time.Second))
	require.NoError(t, s.Update(func(tx *halfstore.Tx) error {
		// An ID the broker did not make (a RocketMQ client's, say): pending,
		// of no known age.
		h := &storepb.Half{Id: "not-a-broker-id", Topic: "orders", ProducerGroup: "bank", TransactionId: "tx-other",
			Body: []byte("x"), CreatedAt: now.UnixNano(), CheckAfter: int64(time.Hour)}
		if _, _, err := tx.PutHalf(h, true); err != nil {
			return err
		}
		_, _, err := tx.Resolve(resolved[0], halfstore.Commit, storepb.Source_SOURCE_PRODUCER, now.UnixNano())
		return err
	}))
	require.NoError(t, s.View(func(tx *halfstore.Tx) error {
		groups, err := readHalfGroups(tx, now, []time.Duration{time.Minute, time.Hour})
		require.NoError(t, err)
		require.Len(t, groups, 2)
		shop, bank := groups["shop"], groups["bank"]
		require.Equal(t, 4, shop.pending)
		require.Equal(t, now.Add(-2*time.Hour).UnixMilli(), shop.oldest)
		require.Equal(t, []int{2, 1}, shop.olderThan, "a minute old exactly is not older than a minute")
		require.Equal(t, 2, bank.pending)
		require.Equal(t, now.Add(-5*time.Second).UnixMilli(), bank.oldest)
		require.Equal(t, []int{0, 0}, bank.olderThan)
		return nil
	}))
}

// BenchmarkCollectHalf is what a scrape of /metrics costs a node for its
// pending half messages: 200,000 of them in two producer groups, created
// over the last two hours (so that every age threshold counts some).
func BenchmarkCollectHalf(b *testing.B) {
	s, err := halfstore.Open(filepath.Join(b.TempDir(), "fsm.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	const pending = 200_000
	now := time.Now()
	for g := range 2 {
		for from := 0; from < pending/2; from += 20_000 {
			at := make([]time.Time, 20_000)
			for i := range at {
				at[i] = now.Add(-time.Duration(from+i) * 2 * time.Hour / (pending / 2))
			}
			putHalves(b, s, fmt.Sprintf("shop-%d", g), at...)
		}
	}
	var c stateCollector
	metrics := 0
	gauge := func(*prometheus.Desc, float64, ...string) { metrics++ }
	b.ResetTimer()
	for b.Loop() {
		err := s.View(func(tx *halfstore.Tx) error { return c.collectHalf(tx, now, gauge) })
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/pending, "ns/pending")
	if metrics == 0 {
		b.Fatal("no metric collected")
	}
}
