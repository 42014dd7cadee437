package halfstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

const (
	pending    = storepb.HalfState_HALF_STATE_PENDING
	committed  = storepb.HalfState_HALF_STATE_COMMITTED
	rolledBack = storepb.HalfState_HALF_STATE_ROLLED_BACK
	expired    = storepb.HalfState_HALF_STATE_EXPIRED
	anyState   = storepb.HalfState_HALF_STATE_UNSPECIFIED

	byProducer  = storepb.Source_SOURCE_PRODUCER
	byCheckback = storepb.Source_SOURCE_CHECKBACK
	byOperator  = storepb.Source_SOURCE_OPERATOR
	byExpiry    = storepb.Source_SOURCE_EXPIRY
)

// ---- half message lifecycle ----

func TestPutHalfStoresPending(t *testing.T) {
	s := openStore(t)
	in := half("m1", "pg", "order-42:paid")
	want := proto.Clone(in).(*storepb.Half)

	got, dup := putHalf(t, s, in)
	require.True(t, !dup, "first PutHalf is not a duplicate")

	want.State = pending
	want.BodySize = uint32(len("body of m1"))
	want.NextCheckAt = t0 + 6*sec
	want.ContentHash = contentHash([]byte("body of m1"))
	protoEq(t, want, got)
	protoEq(t, want, getHalf(t, s, "m1"), "stored record")

	view(t, s, func(tx *Tx) error {
		id, err := tx.HalfIDByTx("pg", "order-42:paid")
		require.NoError(t, err)
		require.Equal(t, "m1", id)

		_, err = tx.HalfIDByTx("pg", "order-43:paid")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.HalfIDByTx("other-group", "order-42:paid")
		require.ErrorIs(t, err, ErrNotFound)

		// The topic was created on the way, and nothing is visible in it.
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(0), tp.LastSequence)
		require.Equal(t, t0, tp.CreatedAt)
		ms, err := tx.ReadTopic("orders", 0, 100)
		require.NoError(t, err)
		require.Equal(t, 0, len(ms), "a half message is not in the topic log")
		return nil
	})
	require.Equal(t, []string{"m1"}, ids(listHalf(t, s, "", pending, "", 10)))
	require.Equal(t, []string{"m1"}, ids(listHalf(t, s, "pg", anyState, "", 10)))
	require.Equal(t, map[string][]storepb.HalfState{"m1": {pending}}, stateIndex(t, s))
}

func TestCommitAppendsToTopic(t *testing.T) {
	s := openStore(t)
	// One plain message first, so the commit must take the next sequence.
	m, _ := send(t, s, "orders", "plain-1", "", 0, t0)
	require.Equal(t, uint64(1), m.Sequence)
	putHalf(t, s, half("m1", "pg", "tx1"))
	putHalf(t, s, half("m2", "pg", "tx2"))
	before := getHalf(t, s, "m1")

	h, err := resolve(t, s, "m1", Commit, byProducer, t0+sec)
	require.NoError(t, err)

	want := proto.Clone(before).(*storepb.Half)
	want.State = committed
	want.Sequence = 2
	want.ResolvedAt = t0 + sec
	want.ResolutionSource = byProducer
	want.Body = nil
	want.NextCheckAt = 0
	protoEq(t, want, h)
	protoEq(t, want, getHalf(t, s, "m1"), "stored record")
	require.Equal(t, uint32(len("body of m1")), h.BodySize, "body size is kept")

	view(t, s, func(tx *Tx) error {
		msg, err := tx.Message("orders", 2)
		require.NoError(t, err)
		protoEq(t, &storepb.Message{
			Id:            "m1",
			Sequence:      2,
			Key:           "key-m1",
			Properties:    map[string]string{"origin": "m1"},
			Body:          []byte("body of m1"),
			CommittedAt:   t0 + sec,
			ProducerGroup: "pg",
			TransactionId: "tx1",
		}, msg)
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(2), tp.LastSequence)
		return nil
	})
	require.Equal(t, []string{"m2"}, ids(listHalf(t, s, "", pending, "", 10)))
	require.Equal(t, []string{"m1"}, ids(listHalf(t, s, "", committed, "", 10)))
	require.Equal(t, map[string][]storepb.HalfState{"m1": {committed}, "m2": {pending}}, stateIndex(t, s))

	h2, err := resolve(t, s, "m2", Commit, byCheckback, t0+2*sec)
	require.NoError(t, err)
	require.Equal(t, uint64(3), h2.Sequence)
	require.Equal(t, byCheckback, h2.ResolutionSource)
	require.Equal(t, []uint64{1, 2, 3}, seqs(readTopic(t, s, "orders", 0, 100)))
	require.Equal(t, []string{"plain-1", "m1", "m2"}, ids(readTopic(t, s, "orders", 0, 100)))
}

func TestRollbackLeavesTombstone(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("m1", "pg", "tx1"))
	before := getHalf(t, s, "m1")

	h, err := resolve(t, s, "m1", Rollback, byCheckback, t0+sec)
	require.NoError(t, err)

	want := proto.Clone(before).(*storepb.Half)
	want.State = rolledBack
	want.ResolvedAt = t0 + sec
	want.ResolutionSource = byCheckback
	want.CheckAttempts = 1 // the resolving check-back reached the producer
	want.Body = nil
	want.NextCheckAt = 0
	protoEq(t, want, h)
	protoEq(t, want, getHalf(t, s, "m1"), "the tombstone stays")
	require.Equal(t, 0, len(readTopic(t, s, "orders", 0, 100)), "nothing in the topic log")
	require.Equal(t, []string{"m1"}, ids(listHalf(t, s, "", rolledBack, "", 10)))
	require.Equal(t, 0, len(listHalf(t, s, "", pending, "", 10)))
	require.Equal(t, map[string][]storepb.HalfState{"m1": {rolledBack}}, stateIndex(t, s))
}

func TestResolveTwiceIsNoOp(t *testing.T) {
	for _, r := range []Resolution{Commit, Rollback} {
		t.Run(r.verb(), func(t *testing.T) {
			s := openStore(t)
			putHalf(t, s, half("m1", "pg", "tx1"))
			first, err := resolve(t, s, "m1", r, byProducer, t0+sec)
			require.NoError(t, err)
			before := dump(t, s)

			for _, src := range []storepb.Source{byProducer, byCheckback, byOperator} {
				again, err := resolve(t, s, "m1", r, src, t0+5*sec)
				require.NoError(t, err, "second %s by %v", r.verb(), src)
				protoEq(t, first, again, "the second resolution returns the first")
			}
			require.Equal(t, before, dump(t, s), "the second resolution changed the store")
			n := 0
			if r == Commit {
				n = 1
			}
			require.Equal(t, n, len(readTopic(t, s, "orders", 0, 100)))
		})
	}
}

func TestResolveConflict(t *testing.T) {
	cases := []struct {
		first, second Resolution
		state         string
	}{
		{Rollback, Commit, "ROLLED_BACK"},
		{Commit, Rollback, "COMMITTED"},
	}
	for _, c := range cases {
		t.Run(c.second.verb()+" after "+c.first.verb(), func(t *testing.T) {
			s := openStore(t)
			putHalf(t, s, half("m1", "pg", "tx1"))
			_, err := resolve(t, s, "m1", c.first, byProducer, t0+sec)
			require.NoError(t, err)
			before := dump(t, s)

			// First resolution wins, whoever asks second, operators included.
			for _, src := range []storepb.Source{byProducer, byCheckback, byOperator} {
				h, err := resolve(t, s, "m1", c.second, src, t0+2*sec)
				require.ErrorIs(t, err, ErrConflict)
				require.ErrorContains(t, err, c.state)
				require.ErrorContains(t, err, "m1")
				require.Equal(t, c.state, StateName(h.State), "the current record is returned")
			}
			require.Equal(t, before, dump(t, s), "a refused resolution wrote something")
		})
	}
}

func TestExpire(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("m1", "pg", "tx1"))
	before := getHalf(t, s, "m1")

	h, err := expire(t, s, "m1", t0+24*3600*sec)
	require.NoError(t, err)
	want := proto.Clone(before).(*storepb.Half)
	want.State = expired
	want.ResolvedAt = t0 + 24*3600*sec
	want.ResolutionSource = byExpiry
	want.NextCheckAt = 0
	protoEq(t, want, h, "the body is kept for an operator")
	protoEq(t, want, getHalf(t, s, "m1"))
	require.Equal(t, []string{"m1"}, ids(listHalf(t, s, "", expired, "", 10)))
	require.Equal(t, 0, len(listHalf(t, s, "", pending, "", 10)))
	require.Equal(t, map[string][]storepb.HalfState{"m1": {expired}}, stateIndex(t, s))

	// Expiring again changes nothing.
	snap := dump(t, s)
	again, err := expire(t, s, "m1", t0+25*3600*sec)
	require.NoError(t, err)
	protoEq(t, want, again)
	require.Equal(t, snap, dump(t, s))

	// Producers and check-backs may not resolve it any more.
	for _, src := range []storepb.Source{byProducer, byCheckback} {
		for _, r := range []Resolution{Commit, Rollback} {
			h, err := resolve(t, s, "m1", r, src, t0+25*3600*sec)
			require.ErrorIs(t, err, ErrExpired, "%s by %v", r.verb(), src)
			require.ErrorContains(t, err, "EXPIRED")
			require.Equal(t, expired, h.State)
		}
	}
	require.Equal(t, snap, dump(t, s), "a refused resolution wrote something")
	require.Equal(t, 0, len(readTopic(t, s, "orders", 0, 10)))
}

func TestOperatorResolvesExpired(t *testing.T) {
	t.Run("commit", func(t *testing.T) {
		s := openStore(t)
		putHalf(t, s, half("m1", "pg", "tx1"))
		_, err := expire(t, s, "m1", t0+10*sec)
		require.NoError(t, err)

		h, err := resolve(t, s, "m1", Commit, byOperator, t0+20*sec)
		require.NoError(t, err)
		require.Equal(t, committed, h.State)
		require.Equal(t, byOperator, h.ResolutionSource)
		require.Equal(t, t0+20*sec, h.ResolvedAt)
		require.Equal(t, uint64(1), h.Sequence)
		require.Equal(t, 0, len(h.Body))

		ms := readTopic(t, s, "orders", 0, 10)
		require.Equal(t, 1, len(ms))
		require.Equal(t, "m1", ms[0].Id)
		require.Equal(t, "body of m1", string(ms[0].Body), "the operator commit delivers the body")
		require.Equal(t, t0+20*sec, ms[0].CommittedAt)
		require.Equal(t, map[string][]storepb.HalfState{"m1": {committed}}, stateIndex(t, s))

		// Now it is committed: expiring it is a conflict.
		_, err = expire(t, s, "m1", t0+30*sec)
		require.ErrorIs(t, err, ErrConflict)
		require.ErrorContains(t, err, "COMMITTED")
	})
	t.Run("rollback", func(t *testing.T) {
		s := openStore(t)
		putHalf(t, s, half("m1", "pg", "tx1"))
		_, err := expire(t, s, "m1", t0+10*sec)
		require.NoError(t, err)

		h, err := resolve(t, s, "m1", Rollback, byOperator, t0+20*sec)
		require.NoError(t, err)
		require.Equal(t, rolledBack, h.State)
		require.Equal(t, byOperator, h.ResolutionSource)
		require.Equal(t, 0, len(h.Body))
		require.Equal(t, 0, len(readTopic(t, s, "orders", 0, 10)))
		require.Equal(t, map[string][]storepb.HalfState{"m1": {rolledBack}}, stateIndex(t, s))

		_, err = expire(t, s, "m1", t0+30*sec)
		require.ErrorIs(t, err, ErrConflict)
		require.ErrorContains(t, err, "ROLLED_BACK")
	})
}

func TestExpireResolvedIsConflict(t *testing.T) {
	for _, r := range []Resolution{Commit, Rollback} {
		s := openStore(t)
		putHalf(t, s, half("m1", "pg", "tx1"))
		_, err := resolve(t, s, "m1", r, byProducer, t0+sec)
		require.NoError(t, err)
		before := dump(t, s)
		h, err := expire(t, s, "m1", t0+2*sec)
		require.ErrorIs(t, err, ErrConflict)
		require.ErrorContains(t, err, StateName(r.target()))
		require.Equal(t, r.target(), h.State)
		require.Equal(t, before, dump(t, s))
	}
}

func TestUnknownHalf(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("m1", "pg", "tx1"))
	view(t, s, func(tx *Tx) error {
		_, err := tx.Half("nope")
		require.ErrorIs(t, err, ErrNotFound)
		require.ErrorContains(t, err, "nope")
		return nil
	})
	_, err := resolve(t, s, "nope", Commit, byProducer, t0)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = resolve(t, s, "nope", Rollback, byOperator, t0)
	require.ErrorIs(t, err, ErrNotFound)
	_, err = expire(t, s, "nope", t0)
	require.ErrorIs(t, err, ErrNotFound)

	_, err = resolve(t, s, "m1", Resolution(0), byProducer, t0)
	require.ErrorIs(t, err, ErrInvalid)
	_, err = resolve(t, s, "m1", Resolution(7), byProducer, t0)
	require.ErrorIs(t, err, ErrInvalid)
	require.Equal(t, pending, getHalf(t, s, "m1").State)
}

// ---- PutHalf idempotency ----

func TestPutHalfIdempotent(t *testing.T) {
	transitions := map[string]func(*testing.T, *Store){
		"pending": func(*testing.T, *Store) {},
		"committed": func(t *testing.T, s *Store) {
			_, err := resolve(t, s, "m1", Commit, byProducer, t0+sec)
			require.NoError(t, err)
		},
		"rolled back": func(t *testing.T, s *Store) {
			_, err := resolve(t, s, "m1", Rollback, byProducer, t0+sec)
			require.NoError(t, err)
		},
		"expired": func(t *testing.T, s *Store) {
			_, err := expire(t, s, "m1", t0+sec)
			require.NoError(t, err)
		},
	}
	for name, transition := range transitions {
		t.Run(name, func(t *testing.T) {
			s := openStore(t)
			putHalf(t, s, half("m1", "pg", "tx1"))
			transition(t, s)
			first := getHalf(t, s, "m1")
			before := dump(t, s)

			// The retry gets a new broker ID, and carries the same topic
			// and body (another body is refused: content_test.go).
			retry := half("m2", "pg", "tx1")
			retry.Body = []byte("body of m1")
			got, dup := putHalf(t, s, retry)
			require.True(t, dup, "the retry is a duplicate")
			require.Equal(t, "m1", got.Id, "the first ID is returned")
			protoEq(t, first, got, "the first record is returned unchanged")
			require.Equal(t, before, dump(t, s), "a duplicate PutHalf wrote something")

			view(t, s, func(tx *Tx) error {
				_, err := tx.Half("m2")
				require.ErrorIs(t, err, ErrNotFound)
				id, err := tx.HalfIDByTx("pg", "tx1")
				require.NoError(t, err)
				require.Equal(t, "m1", id)
				return nil
			})
			require.Equal(t, []string{"m1"}, ids(listHalf(t, s, "", anyState, "", 10)))
		})
	}
}

func TestPutHalfSameTxOtherGroup(t *testing.T) {
	s := openStore(t)
	_, dup := putHalf(t, s, half("m1", "pg-a", "tx1"))
	require.True(t, !dup)
	_, dup = putHalf(t, s, half("m2", "pg-b", "tx1"))
	require.True(t, !dup, "the same transaction ID in another group is another message")
	view(t, s, func(tx *Tx) error {
		a, err := tx.HalfIDByTx("pg-a", "tx1")
		require.NoError(t, err)
		b, err := tx.HalfIDByTx("pg-b", "tx1")
		require.NoError(t, err)
		require.Equal(t, "m1", a)
		require.Equal(t, "m2", b)
		return nil
	})
	require.Equal(t, []string{"m1", "m2"}, ids(listHalf(t, s, "", pending, "", 10)))

	// Resolving one leaves the other alone.
	_, err := resolve(t, s, "m1", Rollback, byProducer, t0+sec)
	require.NoError(t, err)
	require.Equal(t, pending, getHalf(t, s, "m2").State)
}

func TestPutHalfInvalid(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("m1", "pg", "tx1"))
	before := dump(t, s)

	cases := map[string]*storepb.Half{
		"no ID":             half("", "pg", "tx2"),
		"no group":          half("m2", "", "tx2"),
		"no transaction ID": half("m2", "pg", ""),
		"message ID reused": half("m1", "pg", "tx2"),
	}
	for name, h := range cases {
		update(t, s, func(tx *Tx) error {
			_, _, err := tx.PutHalf(h, true)
			require.ErrorIs(t, err, ErrInvalid, name)
			return nil
		})
	}
	require.Equal(t, before, dump(t, s), "a refused PutHalf wrote something")
}

func TestPutHalfTopicMissing(t *testing.T) {
	s := openStore(t)
	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.PutHalf(half("m1", "pg", "tx1"), false)
		require.ErrorIs(t, err, ErrNotFound)
		require.ErrorContains(t, err, "orders")
		return nil // commit: the refusal itself must not have written
	})
	require.Equal(t, before, dump(t, s), "a refused PutHalf wrote something")
	view(t, s, func(tx *Tx) error {
		_, err := tx.HalfIDByTx("pg", "tx1")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.Half("m1")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.Topic("orders")
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})

	// With the topic there, createTopic=false is fine.
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateTopic("orders", t0)
		require.NoError(t, err)
		_, dup, err := tx.PutHalf(half("m1", "pg", "tx1"), false)
		require.True(t, !dup)
		return err
	})
	require.Equal(t, pending, getHalf(t, s, "m1").State)
}

// ---- Send ----

func TestSendSequences(t *testing.T) {
	s := openStore(t)
	for i := 1; i <= 3; i++ {
		m, dup := send(t, s, "orders", fmt.Sprintf("s%d", i), "", 0, t0+int64(i))
		require.True(t, !dup)
		require.Equal(t, uint64(i), m.Sequence)
		require.Equal(t, t0+int64(i), m.CommittedAt)
	}
	ms := readTopic(t, s, "orders", 0, 10)
	require.Equal(t, []uint64{1, 2, 3}, seqs(ms))
	require.Equal(t, []string{"s1", "s2", "s3"}, ids(ms))
	require.Equal(t, "body of s2", string(ms[1].Body))

	update(t, s, func(tx *Tx) error {
		_, _, err := tx.Send("orders", &storepb.Message{Body: []byte("x")}, true, 0, t0)
		require.ErrorIs(t, err, ErrInvalid, "a message without ID")
		_, _, err = tx.Send("nope", &storepb.Message{Id: "x"}, false, 0, t0)
		require.ErrorIs(t, err, ErrNotFound, "a missing topic without auto-create")
		return nil
	})
	require.Equal(t, []uint64{1, 2, 3}, seqs(readTopic(t, s, "orders", 0, 10)))
	view(t, s, func(tx *Tx) error {
		_, err := tx.Topic("nope")
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

func TestSendDedup(t *testing.T) {
	const window = 10 * sec
	s := openStore(t)
	first, dup := send(t, s, "orders", "a1", "k", window, t0)
	require.True(t, !dup)
	require.Equal(t, uint64(1), first.Sequence)

	// Within the window: the first message back, nothing appended.
	before := dump(t, s)
	for _, now := range []int64{t0, t0 + sec, t0 + window - 1} {
		m, dup := sendAs(t, s, "orders", "a2", "k", "body of a1", window, now)
		require.True(t, dup, "a repeat at +%d ns is a duplicate", now-t0)
		require.Equal(t, "a1", m.Id)
		require.Equal(t, uint64(1), m.Sequence)
	}
	require.Equal(t, before, dump(t, s), "a duplicate Send wrote something")

	// The same key on another topic is not a duplicate.
	other, dup := send(t, s, "payments", "b1", "k", window, t0+sec)
	require.True(t, !dup, "dedup is per topic")
	require.Equal(t, uint64(1), other.Sequence)

	// After the window the key is new again, and the window restarts.
	m, dup := send(t, s, "orders", "a3", "k", window, t0+window)
	require.True(t, !dup, "a repeat after the window is a new message")
	require.Equal(t, "a3", m.Id)
	require.Equal(t, uint64(2), m.Sequence)
	m, dup = sendAs(t, s, "orders", "a4", "k", "body of a3", window, t0+window+sec)
	require.True(t, dup)
	require.Equal(t, "a3", m.Id)
	require.Equal(t, uint64(2), m.Sequence)

	require.Equal(t, []string{"a1", "a3"}, ids(readTopic(t, s, "orders", 0, 10)))
	require.Equal(t, []string{"b1"}, ids(readTopic(t, s, "payments", 0, 10)))
}

func TestSendWithoutKeyNeverDedups(t *testing.T) {
	s := openStore(t)
	for i := 0; i < 3; i++ {
		_, dup := send(t, s, "orders", fmt.Sprintf("s%d", i), "", 3600*sec, t0)
		require.True(t, !dup)
	}
	require.Equal(t, []uint64{1, 2, 3}, seqs(readTopic(t, s, "orders", 0, 10)))
	view(t, s, func(tx *Tx) error {
		require.Equal(t, 0, tx.tx.Bucket(bktDedup).Stats().KeyN, "no dedup record without a key")
		return nil
	})
}

// ---- ListHalf ----

func TestListHalf(t *testing.T) {
	s := openStore(t)
	const n = 23
	var all, groupA, groupB []string
	order := rand.New(rand.NewPCG(1, 2)).Perm(n) // insert out of ID order
	for _, i := range order {
		id := fmt.Sprintf("m%02d", i)
		g := "pg-a"
		if i%3 == 0 {
			g = "pg-b"
		}
		putHalf(t, s, half(id, g, "tx-"+id))
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("m%02d", i)
		all = append(all, id)
		if i%3 == 0 {
			groupB = append(groupB, id)
		} else {
			groupA = append(groupA, id)
		}
	}

	require.Equal(t, all, ids(listHalf(t, s, "", anyState, "", 100)))
	require.Equal(t, all, ids(listHalf(t, s, "", pending, "", 100)))
	require.Equal(t, groupA, ids(listHalf(t, s, "pg-a", anyState, "", 100)))
	require.Equal(t, groupB, ids(listHalf(t, s, "pg-b", pending, "", 100)))
	require.Equal(t, 0, len(listHalf(t, s, "pg-c", anyState, "", 100)))
	require.Equal(t, 0, len(listHalf(t, s, "", committed, "", 100)))

	// Move some messages on; each is listed under its new state only.
	want := map[storepb.HalfState][]string{}
	for i, id := range all {
		var err error
		switch i % 4 {
		case 1:
			_, err = resolve(t, s, id, Commit, byProducer, t0+sec)
		case 2:
			_, err = resolve(t, s, id, Rollback, byCheckback, t0+sec)
		case 3:
			_, err = expire(t, s, id, t0+sec)
		}
		require.NoError(t, err)
		st := getHalf(t, s, id).State
		want[st] = append(want[st], id)
	}
	idx := stateIndex(t, s)
	require.Equal(t, n, len(idx))
	for id, sts := range idx {
		require.Equal(t, []storepb.HalfState{getHalf(t, s, id).State}, sts, "state index of %s", id)
	}
	for _, st := range []storepb.HalfState{pending, committed, rolledBack, expired} {
		require.Equal(t, want[st], ids(listHalf(t, s, "", st, "", 100)), "state %s", StateName(st))
		for _, h := range listHalf(t, s, "pg-b", st, "", 100) {
			require.Equal(t, "pg-b", h.ProducerGroup)
			require.Equal(t, st, h.State)
		}
	}

	// Paging returns every message exactly once, in ID order, whatever
	// the page size and filters.
	filter := func(group string, st storepb.HalfState) []string {
		var out []string
		for _, h := range listHalf(t, s, "", anyState, "", 100) {
			if (group == "" || h.ProducerGroup == group) && (st == anyState || h.State == st) {
				out = append(out, h.Id)
			}
		}
		return out
	}
	for _, page := range []int{1, 2, 4, 7, 100} {
		for _, group := range []string{"", "pg-a", "pg-b"} {
			for _, st := range []storepb.HalfState{anyState, pending, committed, rolledBack, expired} {
				got := listAll(t, s, group, st, page)
				exp := filter(group, st)
				require.Equal(t, exp, got, "page %d group %q state %s", page, group, StateName(st))
				require.True(t, slices.IsSorted(got))
			}
		}
	}

	// `after` need not be a listed ID.
	require.Equal(t, all[5:8], ids(listHalf(t, s, "", anyState, "m04x", 3)))
	require.Equal(t, 0, len(listHalf(t, s, "", anyState, "m99", 3)))
}

// ---- topics ----

func TestTopics(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		tp, created, err := tx.CreateTopic("orders", t0)
		require.NoError(t, err)
		require.True(t, created)
		protoEq(t, &storepb.Topic{Name: "orders", CreatedAt: t0, FirstSequence: 1}, tp)

		tp, created, err = tx.CreateTopic("orders", t0+sec)
		require.NoError(t, err)
		require.True(t, !created, "the second CreateTopic creates nothing")
		protoEq(t, &storepb.Topic{Name: "orders", CreatedAt: t0, FirstSequence: 1}, tp)

		_, created, err = tx.CreateTopic("audit", t0+2*sec)
		require.NoError(t, err)
		require.True(t, created)

		_, _, err = tx.CreateTopic("", t0)
		require.ErrorIs(t, err, ErrInvalid)
		return nil
	})
	for i := 1; i <= 10; i++ {
		send(t, s, "orders", fmt.Sprintf("s%02d", i), "", 0, t0+int64(i))
	}
	// Idempotent after messages, too: LastSequence is not reset.
	update(t, s, func(tx *Tx) error {
		tp, created, err := tx.CreateTopic("orders", t0+10*sec)
		require.True(t, !created)
		require.Equal(t, uint64(10), tp.LastSequence)
		return err
	})

	view(t, s, func(tx *Tx) error {
		tps, err := tx.Topics()
		require.NoError(t, err)
		require.Equal(t, 2, len(tps))
		require.Equal(t, "audit", tps[0].Name, "topics in name order")
		require.Equal(t, "orders", tps[1].Name)
		require.Equal(t, uint64(10), tps[1].LastSequence)

		_, err = tx.Topic("nope")
		require.ErrorIs(t, err, ErrNotFound)

		type rd struct {
			from  uint64
			limit int
			want  []uint64
		}
		for _, c := range []rd{
			{0, 3, []uint64{1, 2, 3}},
			{1, 3, []uint64{1, 2, 3}},
			{4, 3, []uint64{4, 5, 6}},
			{9, 10, []uint64{9, 10}},
			{10, 1, []uint64{10}},
			{11, 10, []uint64{}},
			{1, 0, []uint64{}},
			{1, 100, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}},
		} {
			ms, err := tx.ReadTopic("orders", c.from, c.limit)
			require.NoError(t, err)
			require.Equal(t, c.want, seqs(ms), "ReadTopic(from %d, limit %d)", c.from, c.limit)
		}
		ms, err := tx.ReadTopic("audit", 0, 10)
		require.NoError(t, err)
		require.Equal(t, 0, len(ms))
		_, err = tx.ReadTopic("nope", 0, 10)
		require.ErrorIs(t, err, ErrNotFound)

		m, err := tx.Message("orders", 7)
		require.NoError(t, err)
		require.Equal(t, "s07", m.Id)
		require.Equal(t, uint64(7), m.Sequence)
		require.Equal(t, t0+7, m.CommittedAt)
		for _, seq := range []uint64{0, 11} {
			_, err = tx.Message("orders", seq)
			require.ErrorIs(t, err, ErrNotFound, "Message(%d)", seq)
		}
		_, err = tx.Message("nope", 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

// ---- consumer groups ----

func setupTopic(t *testing.T, s *Store, topic string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		send(t, s, topic, fmt.Sprintf("%s-%d", topic, i), "", 0, t0+int64(i))
	}
}

func TestCreateGroup(t *testing.T) {
	s := openStore(t)
	setupTopic(t, s, "orders", 5)
	update(t, s, func(tx *Tx) error {
		g, created, err := tx.CreateGroup("orders", "from-start", GroupStart{}, t0+sec, false)
		require.NoError(t, err)
		require.True(t, created)
		protoEq(t, &storepb.Group{Topic: "orders", Name: "from-start", CreatedAt: t0 + sec}, g)

		g, created, err = tx.CreateGroup("orders", "from-now", GroupStart{Latest: true}, t0+sec, false)
		require.NoError(t, err)
		require.True(t, created)
		protoEq(t, &storepb.Group{Topic: "orders", Name: "from-now", CreatedAt: t0 + sec, AckedThrough: 5}, g)

		_, _, err = tx.CreateGroup("nope", "g", GroupStart{}, t0, false)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
	setupTopic(t, s, "payments", 2)

	// Idempotent: the existing group comes back unchanged, whatever the
	// start asked for the second time, and however the topic grew.
	send(t, s, "orders", "late", "", 0, t0+2*sec)
	update(t, s, func(tx *Tx) error {
		g, created, err := tx.CreateGroup("orders", "from-start", GroupStart{Latest: true}, t0+3*sec, false)
		require.NoError(t, err)
		require.True(t, !created)
		protoEq(t, &storepb.Group{Topic: "orders", Name: "from-start", CreatedAt: t0 + sec}, g)
		g, created, err = tx.CreateGroup("orders", "from-now", GroupStart{}, t0+3*sec, false)
		require.NoError(t, err)
		require.True(t, !created)
		require.Equal(t, uint64(5), g.AckedThrough)

		_, _, err = tx.CreateGroup("payments", "from-start", GroupStart{}, t0+4*sec, false)
		return err
	})

	view(t, s, func(tx *Tx) error {
		gs, err := tx.Groups("orders")
		require.NoError(t, err)
		require.Equal(t, []string{"from-now", "from-start"}, groupNames(gs), "groups in name order")
		gs, err = tx.Groups("payments")
		require.NoError(t, err)
		require.Equal(t, []string{"from-start"}, groupNames(gs))
		_, err = tx.Groups("nope")
		require.ErrorIs(t, err, ErrNotFound)

		gs, err = tx.GroupTopics("from-start")
		require.NoError(t, err)
		require.Equal(t, 2, len(gs))
		require.Equal(t, "orders", gs[0].Topic)
		require.Equal(t, "payments", gs[1].Topic)
		gs, err = tx.GroupTopics("from-now")
		require.NoError(t, err)
		require.Equal(t, 1, len(gs))
		gs, err = tx.GroupTopics("nobody")
		require.NoError(t, err)
		require.Equal(t, 0, len(gs))

		_, err = tx.Group("orders", "nobody")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.Group("nope", "from-start")
		require.ErrorIs(t, err, ErrNotFound)

		for seq, want := range map[uint64]bool{1: true, 5: true, 6: false} {
			ok, err := tx.IsAcked("orders", "from-now", seq)
			require.NoError(t, err)
			require.Equal(t, want, ok, "from-now IsAcked(%d)", seq)
			ok, err = tx.IsAcked("orders", "from-start", seq)
			require.NoError(t, err)
			require.Equal(t, false, ok, "from-start IsAcked(%d)", seq)
		}
		_, err = tx.IsAcked("orders", "nobody", 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

func groupNames(gs []*storepb.Group) []string {
	out := []string{}
	for _, g := range gs {
		out = append(out, g.Name)
	}
	return out
}

type ackState struct {
	through uint64
	above   uint64
	list    []uint64
}

func groupState(t *testing.T, s *Store, topic, group string) ackState {
	t.Helper()
	var st ackState
	view(t, s, func(tx *Tx) error {
		g, err := tx.Group(topic, group)
		require.NoError(t, err)
		st.through, st.above = g.AckedThrough, g.AckedAbove
		st.list, err = tx.AckedAbove(topic, group)
		require.NoError(t, err)
		if st.list == nil {
			st.list = []uint64{}
		}
		return nil
	})
	return st
}

func ack(t *testing.T, s *Store, topic, group string, seqs ...uint64) error {
	t.Helper()
	var aerr error
	update(t, s, func(tx *Tx) error {
		_, aerr = tx.Ack(topic, group, seqs, nil)
		return nil // commit even a refusal: it must not have written
	})
	return aerr
}

func TestAck(t *testing.T) {
	s := openStore(t)
	setupTopic(t, s, "orders", 8)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateGroup("orders", "g", GroupStart{}, t0, false)
		return err
	})
	steps := []struct {
		acks []uint64
		want ackState
	}{
		{[]uint64{1}, ackState{1, 0, []uint64{}}},
		{[]uint64{3, 5}, ackState{1, 2, []uint64{3, 5}}},
		{[]uint64{3}, ackState{1, 2, []uint64{3, 5}}},       // duplicate
		{[]uint64{1}, ackState{1, 2, []uint64{3, 5}}},       // below acked_through
		{[]uint64{7, 7}, ackState{1, 3, []uint64{3, 5, 7}}}, // twice in one call
		{[]uint64{2}, ackState{3, 2, []uint64{5, 7}}},       // fills a gap
		{[]uint64{}, ackState{3, 2, []uint64{5, 7}}},        // nothing
		{[]uint64{6, 4}, ackState{7, 0, []uint64{}}},        // out of order, collapses all
		{[]uint64{8, 8, 1, 2}, ackState{8, 0, []uint64{}}},  // up to the end
		{[]uint64{1, 2, 3, 4, 5, 6, 7, 8}, ackState{8, 0, []uint64{}}},
	}
	for i, step := range steps {
		require.NoError(t, ack(t, s, "orders", "g", step.acks...), "step %d", i)
		require.Equal(t, step.want, groupState(t, s, "orders", "g"), "after step %d: ack %v", i, step.acks)
		view(t, s, func(tx *Tx) error {
			for seq := uint64(1); seq <= 8; seq++ {
				ok, err := tx.IsAcked("orders", "g", seq)
				require.NoError(t, err)
				want := seq <= step.want.through || slices.Contains(step.want.list, seq)
				require.Equal(t, want, ok, "step %d IsAcked(%d)", i, seq)
			}
			return nil
		})
	}
	// The return value of Ack is the new progress, and IsAcked sees it in
	// the same transaction.
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateGroup("orders", "h", GroupStart{}, t0, false)
		require.NoError(t, err)
		g, err := tx.Ack("orders", "h", []uint64{1, 2}, nil)
		require.NoError(t, err)
		require.Equal(t, uint64(2), g.AckedThrough)
		require.Equal(t, uint64(0), g.AckedAbove)
		ok, err := tx.IsAcked("orders", "h", 2)
		require.NoError(t, err)
		require.True(t, ok, "IsAcked inside the acking transaction")
		return nil
	})
}

// The same acks give the same group progress whether the FSM applies them
// one Update each or batched into one Update.
func TestAckIndependentOfBatching(t *testing.T) {
	one, batched := openStore(t), openStore(t)
	// Out of order, with repeats within a call and across calls.
	batches := [][]uint64{{2}, {1, 1}, {4}, {3, 3}, {2}}
	for _, s := range []*Store{one, batched} {
		setupTopic(t, s, "orders", 5)
		update(t, s, func(tx *Tx) error {
			_, _, err := tx.CreateGroup("orders", "g", GroupStart{}, t0, false)
			return err
		})
	}
	for _, b := range batches {
		require.NoError(t, ack(t, one, "orders", "g", b...))
	}
	update(t, batched, func(tx *Tx) error {
		for _, b := range batches {
			if _, err := tx.Ack("orders", "g", b, nil); err != nil {
				return err
			}
		}
		return nil
	})
	want := ackState{4, 0, []uint64{}}
	require.Equal(t, want, groupState(t, one, "orders", "g"), "one Update per Ack")
	require.Equal(t, want, groupState(t, batched, "orders", "g"), "all Acks in one Update")
	require.Equal(t, dump(t, one), dump(t, batched))
}

// Once an Ack is committed, IsAcked
// reports exactly the acked sequences, and acked_through plus the AckedAbove
// list cover exactly them.
func TestAckedSetAcrossTransactions(t *testing.T) {
	s := openStore(t)
	setupTopic(t, s, "orders", 10)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateGroup("orders", "g", GroupStart{}, t0, false)
		return err
	})
	acked := map[uint64]bool{}
	for i, b := range [][]uint64{{1}, {3, 5}, {3}, {1}, {2}, {9, 10}, {4}, {}, {6, 7, 8}} {
		require.NoError(t, ack(t, s, "orders", "g", b...))
		for _, seq := range b {
			acked[seq] = true
		}
		st := groupState(t, s, "orders", "g")
		covered := map[uint64]bool{}
		for seq := uint64(1); seq <= st.through; seq++ {
			covered[seq] = true
		}
		for _, seq := range st.list {
			require.True(t, seq > st.through, "step %d: AckedAbove lists %d <= acked_through %d", i, seq, st.through)
			covered[seq] = true
		}
		require.Equal(t, acked, covered, "step %d: acked_through %d, AckedAbove %v", i, st.through, st.list)
		view(t, s, func(tx *Tx) error {
			for seq := uint64(1); seq <= 10; seq++ {
				ok, err := tx.IsAcked("orders", "g", seq)
				require.NoError(t, err)
				require.Equal(t, acked[seq], ok, "step %d IsAcked(%d)", i, seq)
			}
			return nil
		})
	}
	err := ack(t, s, "orders", "nobody", 1)
	require.ErrorIs(t, err, ErrNotFound)
	err = ack(t, s, "nope", "g", 1)
	require.ErrorIs(t, err, ErrNotFound)
	view(t, s, func(tx *Tx) error {
		_, err := tx.AckedAbove("orders", "nobody")
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

func TestAckInvalid(t *testing.T) {
	s := openStore(t)
	setupTopic(t, s, "orders", 5)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateGroup("orders", "g", GroupStart{}, t0, false)
		require.NoError(t, err)
		_, err = tx.Ack("orders", "g", []uint64{3}, nil)
		return err
	})
	want := ackState{0, 1, []uint64{3}}
	before := dump(t, s)

	// Refused calls write nothing, even the valid sequences among them.
	for _, bad := range [][]uint64{{0}, {6}, {1 << 40}, {1, 2, 0}, {2, 6}, {1, 2, 4, 5, 99}} {
		err := ack(t, s, "orders", "g", bad...)
		require.ErrorIs(t, err, ErrInvalid, "ack %v", bad)
		require.ErrorContains(t, err, "orders")
		require.Equal(t, want, groupState(t, s, "orders", "g"), "after ack %v", bad)
	}
	require.Equal(t, before, dump(t, s))

	// A good ack followed by a bad one in the same Update, whose fn returns
	// the error: the whole transaction is rolled back.
	err := s.Update(func(tx *Tx) error {
		_, err := tx.Ack("orders", "g", []uint64{1, 2}, nil)
		require.NoError(t, err)
		g, err := tx.Group("orders", "g")
		require.NoError(t, err)
		above, err := tx.AckedAbove("orders", "g")
		require.NoError(t, err)
		require.True(t, g.AckedThrough != want.through || !slices.Equal(above, want.list),
			"the good ack is visible inside the transaction: %v, %v", g, above)
		_, err = tx.Ack("orders", "g", []uint64{0}, nil)
		return err
	})
	require.ErrorIs(t, err, ErrInvalid)
	require.Equal(t, want, groupState(t, s, "orders", "g"))
	require.Equal(t, before, dump(t, s))
	view(t, s, func(tx *Tx) error {
		ok, err := tx.IsAcked("orders", "g", 1)
		require.NoError(t, err)
		require.True(t, !ok)
		return nil
	})
}

// ---- applied index ----

func TestAppliedIndex(t *testing.T) {
	s := openStore(t)
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(0), idx)

	update(t, s, func(tx *Tx) error { return tx.SetAppliedIndex(42) })
	idx, err = s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(42), idx)

	// In the same transaction as the effects: a failed Update keeps neither.
	err = s.Update(func(tx *Tx) error {
		require.NoError(t, tx.SetAppliedIndex(43))
		_, _, err := tx.PutHalf(half("m1", "pg", "tx1"), true)
		require.NoError(t, err)
		require.Equal(t, uint64(43), tx.AppliedIndex())
		return fmt.Errorf("apply failed: %w", ErrInvalid)
	})
	require.ErrorIs(t, err, ErrInvalid)
	idx, err = s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(42), idx)
	_, err = resolve(t, s, "m1", Commit, byProducer, t0)
	require.ErrorIs(t, err, ErrNotFound)

	s = reopen(t, s)
	idx, err = s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(42), idx, "the applied index survives Close/Open")
}

// Write methods in a read-only transaction fail instead of panicking.
func TestWriteInViewFails(t *testing.T) {
	s := openStore(t)
	setupTopic(t, s, "orders", 1)
	before := dump(t, s)
	view(t, s, func(tx *Tx) error {
		require.True(t, tx.SetAppliedIndex(1) != nil)
		_, _, err := tx.PutHalf(half("m1", "pg", "tx1"), true)
		require.True(t, err != nil)
		_, _, err = tx.Send("orders", &storepb.Message{Id: "x"}, true, 0, t0)
		require.True(t, err != nil)
		_, _, err = tx.CreateTopic("other", t0)
		require.True(t, err != nil)
		_, _, err = tx.CreateGroup("orders", "g", GroupStart{}, t0, false)
		require.True(t, err != nil)
		return nil
	})
	require.Equal(t, before, dump(t, s))
}

// Names and keys become bbolt keys: empty or over 4096 bytes is refused with
// ErrInvalid, and nothing is written.
func TestNameLimits(t *testing.T) {
	s := openStore(t)
	setupTopic(t, s, "orders", 1)
	long := string(make([]byte, 4097))
	longest := strings.Repeat("n", 4096)
	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		for name, call := range map[string]func() error{
			"empty topic": func() error { _, _, err := tx.CreateTopic("", t0); return err },
			"long topic":  func() error { _, _, err := tx.CreateTopic(long, t0); return err },
			"empty group": func() error { _, _, err := tx.CreateGroup("orders", "", GroupStart{}, t0, false); return err },
			"long group":  func() error { _, _, err := tx.CreateGroup("orders", long, GroupStart{}, t0, false); return err },
			"long send ID": func() error {
				_, _, err := tx.Send("orders", &storepb.Message{Id: long}, true, 0, t0)
				return err
			},
			"long send key": func() error {
				_, _, err := tx.Send("orders", &storepb.Message{Id: "x", Key: long}, true, sec, t0)
				return err
			},
			"long half ID":    func() error { _, _, err := tx.PutHalf(half(long, "pg", "tx"), true); return err },
			"long half group": func() error { _, _, err := tx.PutHalf(half("m1", long, "tx"), true); return err },
			"long half tx":    func() error { _, _, err := tx.PutHalf(half("m1", "pg", long), true); return err },
		} {
			require.ErrorIs(t, call(), ErrInvalid, name)
		}
		return nil
	})
	require.Equal(t, before, dump(t, s), "a refused call wrote something")

	// The longest names are fine.
	update(t, s, func(tx *Tx) error {
		_, created, err := tx.CreateTopic(longest, t0)
		require.NoError(t, err)
		require.True(t, created)
		_, created, err = tx.CreateGroup(longest, longest, GroupStart{}, t0, false)
		require.NoError(t, err)
		require.True(t, created)
		_, dup, err := tx.Send(longest, &storepb.Message{Id: longest, Key: longest}, false, sec, t0)
		require.NoError(t, err)
		require.False(t, dup)
		h := half(longest, longest, longest)
		h.Topic = longest
		_, dup, err = tx.PutHalf(h, false)
		require.NoError(t, err)
		require.False(t, dup)
		_, _, err = tx.Resolve(longest, Commit, byProducer, t0+sec)
		return err
	})
	require.Equal(t, []uint64{1, 2}, seqs(readTopic(t, s, longest, 0, 10)))
}

func TestResolveNeedsAKnownSource(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("m1", "shop", "tx1"))
	for _, src := range []storepb.Source{storepb.Source_SOURCE_UNSPECIFIED, storepb.Source_SOURCE_EXPIRY} {
		_, err := resolve(t, s, "m1", Commit, src, t0+sec)
		require.ErrorIs(t, err, ErrInvalid)
	}
	require.Equal(t, storepb.HalfState_HALF_STATE_PENDING, getHalf(t, s, "m1").State)
}
