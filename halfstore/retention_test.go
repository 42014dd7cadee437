package halfstore

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/halfstore/storepb"
)

func trimPoint(t *testing.T, s *Store, before int64, maxBytes uint64, limit int) uint64 {
	t.Helper()
	var p uint64
	view(t, s, func(tx *Tx) error {
		var err error
		p, err = tx.TrimPoint("orders", before, maxBytes, limit)
		return err
	})
	return p
}

func trim(t *testing.T, s *Store, through uint64, limit int) int {
	t.Helper()
	var n int
	update(t, s, func(tx *Tx) error {
		var err error
		n, err = tx.Trim("orders", through, limit)
		return err
	})
	return n
}

func TestTrimPoint(t *testing.T) {
	s := openStore(t)
	for i := 1; i <= 6; i++ {
		send(t, s, "orders", fmt.Sprintf("s%d", i), "", 0, t0+int64(i)*sec, 100)
	}
	var size uint64
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic("orders")
		size = tp.Bytes
		return err
	})
	one := size / 6 // every record has the same size
	require.Equal(t, size, 6*one)

	for _, c := range []struct {
		name     string
		before   int64
		maxBytes uint64
		limit    int
		want     uint64
	}{
		{"nothing old", t0, 0, 100, 0},
		{"committed before 3s", t0 + 3*sec, 0, 100, 2},
		{"just after 3s", t0 + 3*sec + 1, 0, 100, 3},
		{"all old", t0 + 10*sec, 0, 100, 6},
		{"all old, limit", t0 + 10*sec, 0, 4, 4},
		{"over by bytes", 0, 4 * one, 100, 2},
		{"over by a byte", 0, 4*one - 1, 100, 3},
		{"bytes within", 0, size, 100, 0},
		{"either", t0 + 2*sec, 3 * one, 100, 3},
		{"either, time wins", t0 + 5*sec, 3 * one, 100, 4},
	} {
		require.Equal(t, c.want, trimPoint(t, s, c.before, c.maxBytes, c.limit), c.name)
	}

	require.Equal(t, 2, trim(t, s, 2, 100))
	require.Equal(t, uint64(0), trimPoint(t, s, t0+3*sec, 0, 100), "1 and 2 are gone")
	require.Equal(t, uint64(3), trimPoint(t, s, t0+4*sec, 0, 100))
	require.Equal(t, uint64(3), trimPoint(t, s, 0, 3*one, 100), "bytes follow the trim")

	view(t, s, func(tx *Tx) error {
		_, err := tx.TrimPoint("orders", t0, 0, 0)
		require.ErrorIs(t, err, ErrInvalid)
		_, err = tx.TrimPoint("nope", t0, 0, 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

func TestTrim(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "", "", "", "", "", "", "", "", "", "") // 10 messages
	createGroup(t, s, "orders", "fast", GroupStart{Latest: true})
	createGroup(t, s, "orders", "slow", GroupStart{})
	createGroup(t, s, "orders", "mixed", GroupStart{})
	require.NoError(t, ack(t, s, "orders", "mixed", 1, 3, 4, 7))
	_, err := fail(t, s, "orders", "mixed", t0, retryOf(2, 1), retryOf(5, 1), retryOf(8, 1), deadOf(6, 16))
	require.NoError(t, err)
	checkGroup(t, s, "orders", "mixed")

	// Trim through 5: "mixed" had 1, 3, 4 acked (and 6 dead, 7 acked above
	// the trim); 2 and 5 were not acked: dropped. acked_through moves to 5,
	// then on over 6 and 7.
	require.Equal(t, 5, trim(t, s, 5, 100))
	checkTopic(t, s, "orders")
	require.Equal(t, []uint64{6, 7, 8, 9, 10}, seqs(readTopic(t, s, "orders", 0, 100)))
	require.Equal(t, []uint64{6, 7}, seqs(readTopic(t, s, "orders", 2, 2)), "reading from before the first starts at the first")
	g := getGroup(t, s, "orders", "mixed")
	require.Equal(t, uint64(7), g.AckedThrough)
	require.Equal(t, uint64(2), g.Dropped)
	require.Equal(t, uint64(1), g.Retrying, "8 still retries")
	require.Equal(t, uint64(1), g.DeadLetters, "the DLQ outlives retention")
	checkGroup(t, s, "orders", "mixed")
	g = getGroup(t, s, "orders", "slow")
	require.Equal(t, uint64(5), g.AckedThrough)
	require.Equal(t, uint64(5), g.Dropped)
	g = getGroup(t, s, "orders", "fast")
	require.Equal(t, uint64(10), g.AckedThrough)
	require.Equal(t, uint64(0), g.Dropped)
	view(t, s, func(tx *Tx) error {
		_, err := tx.Message("orders", 5)
		require.ErrorIs(t, err, ErrNotFound)
		dl, err := tx.DeadLetterByID("mixed", "orders-6")
		require.NoError(t, err)
		require.Equal(t, "orders-6", dl.Message.Id)
		return nil
	})
	// Acks and failures of trimmed messages change nothing.
	before := getGroup(t, s, "orders", "slow")
	require.NoError(t, ack(t, s, "orders", "slow", 2, 4))
	_, err = fail(t, s, "orders", "slow", t0, retryOf(3, 1), deadOf(1, 16))
	require.NoError(t, err)
	protoEq(t, before, getGroup(t, s, "orders", "slow"))

	// A limit bounds one trim; through past the end stops at the end;
	// nothing due trims nothing.
	require.Equal(t, 2, trim(t, s, 100, 2))
	require.Equal(t, []uint64{8, 9, 10}, seqs(readTopic(t, s, "orders", 0, 100)))
	require.Equal(t, 0, trim(t, s, 7, 100))
	require.Equal(t, 3, trim(t, s, 100, 100))
	checkTopic(t, s, "orders")
	for _, g := range []string{"fast", "slow", "mixed"} {
		checkGroup(t, s, "orders", g)
	}
	require.Equal(t, uint64(10), getGroup(t, s, "orders", "slow").Dropped)
	require.Equal(t, uint64(5), getGroup(t, s, "orders", "mixed").Dropped, "2, 5, 8 (failed is not acked), 9, 10")

	// An empty trimmed log: the next message keeps the sequence, new groups
	// start after the trimmed ones.
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(11), tp.FirstSequence)
		require.Equal(t, uint64(0), tp.Bytes)
		for _, start := range []GroupStart{{}, {Latest: true}, {Time: t0}} {
			seq, err := tx.StartSeq("orders", start)
			require.NoError(t, err)
			require.Equal(t, uint64(11), seq, "%+v", start)
		}
		return nil
	})
	g = createGroup(t, s, "orders", "new", GroupStart{})
	require.Equal(t, uint64(10), g.AckedThrough)
	sendKeyed(t, s, "orders", "")
	require.Equal(t, []uint64{11}, seqs(readTopic(t, s, "orders", 0, 100)))
	checkTopic(t, s, "orders")
	update(t, s, func(tx *Tx) error {
		g, err := tx.ResetGroup("orders", "slow", GroupStart{})
		require.NoError(t, err)
		require.Equal(t, uint64(10), g.AckedThrough, "reset to the earliest retained message")
		return nil
	})

	before2 := dump(t, s)
	update(t, s, func(tx *Tx) error {
		_, err := tx.Trim("orders", 100, 0)
		require.ErrorIs(t, err, ErrInvalid)
		_, err = tx.Trim("nope", 100, 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
	require.Equal(t, before2, dump(t, s))
}

// ---- prune ----

func TestPruneHalves(t *testing.T) {
	s := openStore(t)
	for i := 1; i <= 6; i++ {
		putHalf(t, s, half(fmt.Sprintf("h%d", i), "pg", fmt.Sprintf("tx%d", i)))
	}
	_, err := resolve(t, s, "h1", Commit, byProducer, t0+1*sec)
	require.NoError(t, err)
	_, err = resolve(t, s, "h2", Rollback, byProducer, t0+2*sec)
	require.NoError(t, err)
	_, err = expire(t, s, "h3", t0+3*sec) // parked
	require.NoError(t, err)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.Expire("h4", t0+4*sec, true) // rolled back by expiry
		return err
	})
	_, err = resolve(t, s, "h5", Commit, byProducer, t0+5*sec)
	require.NoError(t, err)
	// h6 stays pending.

	prune := func(resolvedBefore int64, limit int) int {
		t.Helper()
		var n int
		update(t, s, func(tx *Tx) error {
			var dedups int
			var err error
			n, dedups, err = tx.Prune(resolvedBefore, 0, limit)
			require.Equal(t, 0, dedups)
			return err
		})
		return n
	}
	require.Equal(t, 0, prune(t0+sec, 10), "nothing resolved before 1s")
	require.Equal(t, 1, prune(t0+10*sec, 1), "limit")
	require.Equal(t, 2, prune(t0+5*sec, 10), "h2, h4; h3 is parked")
	require.Equal(t, []string{"h3", "h5", "h6"}, ids(listHalf(t, s, "", anyState, "", 10)))
	require.Equal(t, map[string][]storepb.HalfState{"h3": {expired}, "h5": {committed}, "h6": {pending}}, stateIndex(t, s))
	view(t, s, func(tx *Tx) error {
		_, err := tx.HalfIDByTx("pg", "tx1")
		require.ErrorIs(t, err, ErrNotFound)
		id, err := tx.HalfIDByTx("pg", "tx3")
		require.NoError(t, err)
		require.Equal(t, "h3", id)
		return nil
	})

	// An operator resolves the parked one: now it can go.
	_, err = resolve(t, s, "h3", Rollback, byOperator, t0+6*sec)
	require.NoError(t, err)
	require.Equal(t, 2, prune(t0+7*sec, 10))
	require.Equal(t, []string{"h6"}, ids(listHalf(t, s, "", anyState, "", 10)))
	view(t, s, func(tx *Tx) error {
		require.Equal(t, 0, tx.tx.Bucket(bktHalfRes).Stats().KeyN, "index emptied")
		return nil
	})
	// The committed messages stay in the log, and the transaction ID is
	// free again.
	require.Equal(t, []string{"h1", "h5"}, ids(readTopic(t, s, "orders", 0, 10)))
	h, dup := putHalf(t, s, half("h7", "pg", "tx1"))
	require.False(t, dup)
	require.Equal(t, "h7", h.Id)

	update(t, s, func(tx *Tx) error {
		_, _, err := tx.Prune(t0, t0, 0)
		require.ErrorIs(t, err, ErrInvalid)
		return nil
	})
}

func TestPruneDedup(t *testing.T) {
	const window = 10 * sec
	s := openStore(t)
	send(t, s, "orders", "a1", "ka", window, t0)
	send(t, s, "orders", "b1", "kb", window, t0+sec)
	send(t, s, "payments", "c1", "ka", window, t0+2*sec)
	send(t, s, "orders", "n1", "", window, t0+2*sec)
	// ka is sent again after the window: a new record, and one time entry.
	send(t, s, "orders", "a2", "ka", window, t0+window+sec)
	view(t, s, func(tx *Tx) error {
		require.Equal(t, 3, tx.tx.Bucket(bktDedup).Stats().KeyN)
		require.Equal(t, 3, tx.tx.Bucket(bktDedupTime).Stats().KeyN, "one time entry per record")
		return nil
	})

	prune := func(before int64, limit int) int {
		t.Helper()
		var n int
		update(t, s, func(tx *Tx) error {
			var halves int
			var err error
			halves, n, err = tx.Prune(0, before, limit)
			require.Equal(t, 0, halves)
			return err
		})
		return n
	}
	require.Equal(t, 1, prune(t0+5*sec, 1), "limit")
	require.Equal(t, 1, prune(t0+5*sec, 10), "orders/ka's newer record stays")
	_, dup := sendAs(t, s, "orders", "a3", "ka", "body of a2", window, t0+window+2*sec)
	require.True(t, dup, "the newer record still dedups")
	_, dup = send(t, s, "orders", "b2", "kb", window, t0+2*sec)
	require.False(t, dup, "a pruned key is new again")
	require.Equal(t, 2, prune(t0+100*sec, 10))
	view(t, s, func(tx *Tx) error {
		require.Equal(t, 0, tx.tx.Bucket(bktDedup).Stats().KeyN)
		require.Equal(t, 0, tx.tx.Bucket(bktDedupTime).Stats().KeyN)
		return nil
	})
}

// A topic written before first_sequence and bytes existed (a version 0
// store): after the migration its log starts at 1, appends keep it there,
// and its bytes count the whole log, so a trim leaves the exact size.
func TestTopicWithoutRetentionFields(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "", "", "")
	createGroup(t, s, "orders", "g", GroupStart{})
	s = asVersion0(t, s, func(btx *bolt.Tx) error {
		tb := btx.Bucket(bktTopics).Bucket([]byte("orders"))
		tp, err := topicMeta(tb)
		require.NoError(t, err)
		tp.FirstSequence, tp.Bytes = 0, 0
		return put(tb, keyMeta, tp)
	})
	view(t, s, func(tx *Tx) error {
		seq, err := tx.StartSeq("orders", GroupStart{})
		require.NoError(t, err)
		require.Equal(t, uint64(1), seq)
		return nil
	})
	sendKeyed(t, s, "orders", "")
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(1), tp.FirstSequence)
		return nil
	})
	require.Equal(t, 3, trim(t, s, 3, 10))
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(4), tp.FirstSequence)
		return nil
	})
	checkTopic(t, s, "orders")
	require.Equal(t, uint64(3), getGroup(t, s, "orders", "g").Dropped)
	checkGroup(t, s, "orders", "g")
}

func TestPruneDue(t *testing.T) {
	s := openStore(t)
	require.NoError(t, s.View(func(tx *Tx) error {
		require.False(t, tx.PruneDue(1<<62, 1<<62), "an empty store has nothing to prune")
		return nil
	}))
	require.NoError(t, s.Update(func(tx *Tx) error {
		_, _, err := tx.Send("t", &storepb.Message{Id: "m1", Key: "k", Body: []byte("x")}, true, 100, 1000)
		return err
	}))
	require.NoError(t, s.View(func(tx *Tx) error {
		require.False(t, tx.PruneDue(0, 1000), "the key was sent at 1000: not before 1000")
		require.True(t, tx.PruneDue(0, 1001))
		return nil
	}))
}
