package halfstore

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// ---- helpers ----

// sendKeyed appends messages with ordering keys, one second apart from
// t0+sec: message i (from 1) is committed at t0 + i*sec.
func sendKeyed(t *testing.T, s *Store, topic string, keys ...string) {
	t.Helper()
	update(t, s, func(tx *Tx) error {
		tp, _, err := tx.CreateTopic(topic, t0)
		if err != nil {
			return err
		}
		for i, k := range keys {
			n := tp.LastSequence + uint64(i) + 1
			m := &storepb.Message{Id: fmt.Sprintf("%s-%d", topic, n), OrderingKey: k, Body: []byte("body")}
			if _, _, err := tx.Send(topic, m, false, 0, t0+int64(n)*sec); err != nil {
				return err
			}
		}
		return nil
	})
}

func createGroup(t *testing.T, s *Store, topic, group string, start GroupStart) *storepb.Group {
	t.Helper()
	var g *storepb.Group
	update(t, s, func(tx *Tx) error {
		var err error
		g, _, err = tx.CreateGroup(topic, group, start, t0, false)
		return err
	})
	return g
}

func getGroup(t *testing.T, s *Store, topic, group string) *storepb.Group {
	t.Helper()
	var g *storepb.Group
	view(t, s, func(tx *Tx) error {
		var err error
		g, err = tx.Group(topic, group)
		return err
	})
	return g
}

// fail records failures in one Update and commits even a refusal, which
// callers check wrote nothing.
func fail(t *testing.T, s *Store, topic, group string, now int64, fs ...Failure) ([]*storepb.DeadLetter, error) {
	t.Helper()
	var dead []*storepb.DeadLetter
	var ferr error
	update(t, s, func(tx *Tx) error {
		_, dead, ferr = tx.RecordFailures(topic, group, fs, now)
		return nil
	})
	return dead, ferr
}

func retryOf(seq uint64, attempts uint32) Failure {
	return Failure{Seq: seq, Attempts: attempts, RetryAt: t0 + int64(attempts)*sec, Error: fmt.Sprintf("attempt %d failed", attempts)}
}

func deadOf(seq uint64, attempts uint32) Failure {
	f := retryOf(seq, attempts)
	f.Dead = true
	return f
}

func letterSeqs(dls []*storepb.DeadLetter) []uint64 {
	out := []uint64{}
	for _, dl := range dls {
		out = append(out, dl.GetMessage().GetSequence())
	}
	return out
}

// bucketSeqs lists the sequence keys of one of a group's nested buckets.
func bucketSeqs(t testing.TB, tx *Tx, topic, group string, name []byte) []uint64 {
	t.Helper()
	out := []uint64{}
	b := tx.groupBucket(topic, group).Bucket(name)
	if b == nil {
		return out
	}
	require.NoError(t, b.ForEach(func(k, _ []byte) error {
		require.Len(t, k, 8)
		out = append(out, binary.BigEndian.Uint64(k))
		return nil
	}))
	return out
}

// checkGroup checks a group's counters against its buckets, and the
// invariants the dispatcher relies on: acks and retry entries are above
// acked_through, retry entries are unacked, acked_through+1 is not acked,
// and the ID index holds exactly the DLQ.
func checkGroup(t testing.TB, s *Store, topic, group string) {
	t.Helper()
	view(t, s, func(tx *Tx) error {
		g, err := tx.Group(topic, group)
		require.NoError(t, err)
		acked := bucketSeqs(t, tx, topic, group, bktAcked)
		retry := bucketSeqs(t, tx, topic, group, bktRetry)
		dlq := bucketSeqs(t, tx, topic, group, bktDLQ)
		redrive := bucketSeqs(t, tx, topic, group, bktRedrive)
		require.Equal(t, uint64(len(acked)), g.AckedAbove, "acked_above vs %v", acked)
		require.Equal(t, uint64(len(retry)), g.Retrying, "retrying vs %v", retry)
		require.Equal(t, uint64(len(dlq)), g.DeadLetters, "dead_letters vs %v", dlq)
		require.Equal(t, uint64(len(redrive)), g.Redriven, "redriven vs %v", redrive)
		isAcked := map[uint64]bool{}
		for _, a := range acked {
			require.Greater(t, a, g.AckedThrough+1, "ack %d not above acked_through+1 (%d)", a, g.AckedThrough)
			isAcked[a] = true
		}
		tp, err := tx.Topic(topic)
		require.NoError(t, err)
		require.GreaterOrEqual(t, g.AckedThrough+1, tp.FirstSequence, "acked_through below the retained log")
		for _, r := range retry {
			require.Greater(t, r, g.AckedThrough, "retry entry %d is acked", r)
			require.False(t, isAcked[r], "retry entry %d is acked", r)
		}
		for _, seq := range dlq {
			dl, err := tx.DeadLetter(topic, group, seq)
			require.NoError(t, err)
			byID, err := tx.DeadLetterByID(group, dl.Message.Id)
			require.NoError(t, err)
			protoEq(t, dl, byID)
		}
		n := 0
		prefix := group + "\x00"
		require.NoError(t, tx.tx.Bucket(bktDLQIDs).ForEach(func(k, v []byte) error {
			if strings.HasPrefix(string(k), prefix) && strings.HasPrefix(string(v), topic+"\x00") {
				n++
			}
			return nil
		}))
		require.Equal(t, len(dlq), n, "dlq_ids entries of %s/%s", topic, group)
		return nil
	})
}

// checkTopic checks first_sequence and bytes against the log.
func checkTopic(t testing.TB, s *Store, topic string) {
	t.Helper()
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic(topic)
		require.NoError(t, err)
		var size uint64
		var keys []uint64
		require.NoError(t, tx.topicBucket(topic).Bucket(bktLog).ForEach(func(k, v []byte) error {
			size += uint64(len(v))
			keys = append(keys, binary.BigEndian.Uint64(k))
			return nil
		}))
		require.Equal(t, size, tp.Bytes, "topic bytes")
		if len(keys) == 0 {
			require.Equal(t, tp.LastSequence+1, tp.FirstSequence, "empty log: first is the next to come")
			return nil
		}
		require.Equal(t, keys[0], tp.FirstSequence, "first sequence")
		require.Equal(t, keys[len(keys)-1], tp.LastSequence)
		require.Equal(t, uint64(len(keys)), tp.LastSequence-tp.FirstSequence+1, "the retained log has no gaps")
		return nil
	})
}

// ---- start positions ----

func TestGroupStartPositions(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateTopic("empty", t0)
		return err
	})
	sendKeyed(t, s, "orders", "", "", "", "", "") // committed at t0+1s .. t0+5s

	view(t, s, func(tx *Tx) error {
		for _, c := range []struct {
			topic string
			start GroupStart
			want  uint64
		}{
			{"orders", GroupStart{}, 1},
			{"orders", GroupStart{Latest: true}, 6},
			{"orders", GroupStart{Time: 1}, 1},
			{"orders", GroupStart{Time: t0 + sec}, 1},
			{"orders", GroupStart{Time: t0 + sec + 1}, 2},
			{"orders", GroupStart{Time: t0 + 3*sec}, 3},
			{"orders", GroupStart{Time: t0 + 5*sec}, 5},
			{"orders", GroupStart{Time: t0 + 5*sec + 1}, 6},
			{"empty", GroupStart{}, 1},
			{"empty", GroupStart{Latest: true}, 1},
			{"empty", GroupStart{Time: t0}, 1},
		} {
			got, err := tx.StartSeq(c.topic, c.start)
			require.NoError(t, err)
			require.Equal(t, c.want, got, "StartSeq(%s, %+v)", c.topic, c.start)
		}
		_, err := tx.StartSeq("nope", GroupStart{})
		require.ErrorIs(t, err, ErrNotFound)
		for _, bad := range []GroupStart{{Latest: true, Time: t0}, {Time: -1}} {
			_, err := tx.StartSeq("orders", bad)
			require.ErrorIs(t, err, ErrInvalid, "%+v", bad)
		}
		return nil
	})

	g := createGroup(t, s, "orders", "at-3s", GroupStart{Time: t0 + 3*sec})
	require.Equal(t, uint64(2), g.AckedThrough)
	g = createGroup(t, s, "orders", "after-all", GroupStart{Time: t0 + 9*sec})
	require.Equal(t, uint64(5), g.AckedThrough)
	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateGroup("orders", "bad", GroupStart{Latest: true, Time: t0}, t0, false)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, "not both")
		_, _, err = tx.CreateGroup("orders", "bad", GroupStart{Time: -5}, t0, false)
		require.ErrorIs(t, err, ErrInvalid)
		return nil
	})
	require.Equal(t, before, dump(t, s))
	checkGroup(t, s, "orders", "at-3s")
}

// ---- ordering keys, topic accounting ----

func TestOrderingKeyIsStored(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		m, _, err := tx.Send("orders", &storepb.Message{Id: "s1", OrderingKey: "order-42"}, true, 0, t0)
		require.NoError(t, err)
		require.Equal(t, "order-42", m.OrderingKey)
		h := half("h1", "pg", "tx1")
		h.OrderingKey = "order-43"
		_, _, err = tx.PutHalf(h, true)
		require.NoError(t, err)
		_, _, err = tx.Resolve("h1", Commit, byProducer, t0+sec)
		return err
	})
	require.Equal(t, "order-43", getHalf(t, s, "h1").OrderingKey)
	ms := readTopic(t, s, "orders", 1, 10)
	require.Equal(t, []string{"order-42", "order-43"}, []string{ms[0].OrderingKey, ms[1].OrderingKey})

	long := strings.Repeat("k", maxName+1)
	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.Send("orders", &storepb.Message{Id: "s2", OrderingKey: long}, true, 0, t0)
		require.ErrorIs(t, err, ErrInvalid)
		h := half("h2", "pg", "tx2")
		h.OrderingKey = long
		_, _, err = tx.PutHalf(h, true)
		require.ErrorIs(t, err, ErrInvalid)
		return nil
	})
	require.Equal(t, before, dump(t, s))
}

func TestTopicFirstSequenceAndBytes(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateTopic("orders", t0)
		return err
	})
	checkTopic(t, s, "orders")
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic("orders")
		require.NoError(t, err)
		require.Equal(t, uint64(1), tp.FirstSequence, "no message yet: the next to come")
		require.Equal(t, uint64(0), tp.Bytes)
		return nil
	})
	for i := 1; i <= 4; i++ {
		send(t, s, "orders", fmt.Sprintf("s%d", i), "", 0, t0, 10*i)
		checkTopic(t, s, "orders")
	}
	putHalf(t, s, half("h1", "pg", "tx1"))
	_, err := resolve(t, s, "h1", Commit, byProducer, t0+sec)
	require.NoError(t, err)
	checkTopic(t, s, "orders")
}

// ---- failures, dead letters, redrive ----

func TestRecordFailures(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "a", "b", "a", "", "c")
	createGroup(t, s, "orders", "g", GroupStart{})
	createGroup(t, s, "orders", "other", GroupStart{})

	dead, err := fail(t, s, "orders", "g", t0+10*sec, retryOf(1, 1), retryOf(2, 1))
	require.NoError(t, err)
	require.Empty(t, dead)
	dead, err = fail(t, s, "orders", "g", t0+11*sec, retryOf(1, 2))
	require.NoError(t, err)
	require.Empty(t, dead)
	view(t, s, func(tx *Tx) error {
		r, err := tx.Retry("orders", "g", 1)
		require.NoError(t, err)
		protoEq(t, &storepb.Retry{Attempts: 2, RetryAt: t0 + 2*sec, LastError: "attempt 2 failed"}, r)
		r, err = tx.Retry("orders", "g", 3)
		require.NoError(t, err)
		require.Nil(t, r, "never failed")
		r, err = tx.Retry("orders", "other", 1)
		require.NoError(t, err)
		require.Nil(t, r, "failures are per group")
		_, err = tx.Retry("orders", "nobody", 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
	g := getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(3), g.Redeliveries)
	require.Equal(t, uint64(2), g.Retrying)
	checkGroup(t, s, "orders", "g")

	// Dead: a copy of the message in the DLQ, the log sequence acked, the
	// retry entry gone; the group moves on.
	dead, err = fail(t, s, "orders", "g", t0+20*sec, deadOf(1, 16))
	require.NoError(t, err)
	require.Len(t, dead, 1)
	msg1 := readTopic(t, s, "orders", 1, 1)[0]
	want := &storepb.DeadLetter{Message: msg1, Topic: "orders", Group: "g", Attempts: 16, LastError: "attempt 16 failed", DeadAt: t0 + 20*sec}
	protoEq(t, want, dead[0])
	g = getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(1), g.AckedThrough)
	require.Equal(t, uint64(1), g.Retrying)
	require.Equal(t, uint64(1), g.DeadLetters)
	require.Equal(t, uint64(4), g.Redeliveries)
	view(t, s, func(tx *Tx) error {
		dl, err := tx.DeadLetter("orders", "g", 1)
		require.NoError(t, err)
		protoEq(t, want, dl)
		dl, err = tx.DeadLetterByID("g", "orders-1")
		require.NoError(t, err)
		protoEq(t, want, dl)
		_, err = tx.DeadLetterByID("other", "orders-1")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.DeadLetter("orders", "g", 2)
		require.ErrorIs(t, err, ErrNotFound)
		r, err := tx.Retry("orders", "g", 1)
		require.NoError(t, err)
		require.Nil(t, r)
		return nil
	})
	checkGroup(t, s, "orders", "g")

	// Failures of acked messages are skipped, as late reports are.
	require.NoError(t, ack(t, s, "orders", "g", 3))
	before := getGroup(t, s, "orders", "g")
	dead, err = fail(t, s, "orders", "g", t0+21*sec, retryOf(1, 17), deadOf(3, 2), retryOf(3, 2))
	require.NoError(t, err)
	require.Empty(t, dead)
	protoEq(t, before, getGroup(t, s, "orders", "g"))

	// Acking a failed message ends its retry state; dead in the same call
	// as a failure of another one; acked_through collapses over dead ones.
	dead, err = fail(t, s, "orders", "g", t0+22*sec, retryOf(4, 1), deadOf(2, 3))
	require.NoError(t, err)
	require.Equal(t, []uint64{2}, letterSeqs(dead))
	g = getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(3), g.AckedThrough, "1 and 2 dead, 3 acked")
	require.Equal(t, uint64(1), g.Retrying)
	require.NoError(t, ack(t, s, "orders", "g", 4))
	g = getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(0), g.Retrying)
	require.Equal(t, uint64(2), g.DeadLetters)
	checkGroup(t, s, "orders", "g")
	checkGroup(t, s, "orders", "other")

	// Refusals write nothing.
	before2 := dump(t, s)
	for name, fs := range map[string][]Failure{
		"sequence 0":      {retryOf(0, 1)},
		"beyond the end":  {retryOf(5, 1), retryOf(6, 1)},
		"zero attempts":   {{Seq: 5}},
		"redriven 0":      {{Seq: 0, Redriven: true, Attempts: 1}},
		"valid then zero": {retryOf(5, 1), {Seq: 5, Dead: true}},
	} {
		_, err := fail(t, s, "orders", "g", t0, fs...)
		require.ErrorIs(t, err, ErrInvalid, name)
		require.ErrorContains(t, err, "orders/g", name)
	}
	_, err = fail(t, s, "orders", "nobody", t0, retryOf(5, 1))
	require.ErrorIs(t, err, ErrNotFound)
	_, err = fail(t, s, "nope", "g", t0, retryOf(5, 1))
	require.ErrorIs(t, err, ErrNotFound)
	require.Equal(t, before2, dump(t, s))
}

func TestRedriveAndPurge(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "a", "b", "a", "c", "d", "e")
	createGroup(t, s, "orders", "g", GroupStart{})
	_, err := fail(t, s, "orders", "g", t0+10*sec, deadOf(1, 16), deadOf(2, 16), deadOf(4, 16), deadOf(5, 16), deadOf(6, 16))
	require.NoError(t, err)
	checkGroup(t, s, "orders", "g")

	view(t, s, func(tx *Tx) error {
		dls, err := tx.DeadLetters("orders", "g", 0, 10)
		require.NoError(t, err)
		require.Equal(t, []uint64{1, 2, 4, 5, 6}, letterSeqs(dls))
		dls, err = tx.DeadLetters("orders", "g", 2, 2)
		require.NoError(t, err)
		require.Equal(t, []uint64{4, 5}, letterSeqs(dls), "after 2, at most 2")
		dls, err = tx.DeadLetters("orders", "g", ^uint64(0), 2)
		require.NoError(t, err)
		require.Empty(t, dls)
		keys, err := tx.DeadLetterKeys("orders", "g")
		require.NoError(t, err)
		require.Equal(t, map[string]bool{"a": true, "b": true, "c": true, "d": true, "e": true}, keys)
		_, err = tx.DeadLetters("orders", "g", 0, 0)
		require.ErrorIs(t, err, ErrInvalid)
		_, err = tx.DeadLetters("orders", "nobody", 0, 1)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.DeadLetterKeys("orders", "nobody")
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})

	// Redrive by sequence: unknown ones (3 was never dead, 9 never existed)
	// are ignored, repeats count once.
	var moved []*storepb.DeadLetter
	update(t, s, func(tx *Tx) error {
		var err error
		moved, err = tx.Redrive("orders", "g", []uint64{4, 3, 2, 9, 2}, false, 0)
		return err
	})
	require.Equal(t, []uint64{2, 4}, letterSeqs(moved))
	for _, dl := range moved {
		require.Equal(t, uint32(0), dl.Attempts)
		require.Equal(t, int64(0), dl.RetryAt)
		require.Equal(t, "attempt 16 failed", dl.LastError, "the last error is kept")
		require.Equal(t, t0+10*sec, dl.DeadAt)
	}
	g := getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(3), g.DeadLetters)
	require.Equal(t, uint64(2), g.Redriven)
	checkGroup(t, s, "orders", "g")
	view(t, s, func(tx *Tx) error {
		_, err := tx.DeadLetterByID("g", "orders-2")
		require.ErrorIs(t, err, ErrNotFound, "a redriven letter is no longer in the DLQ")
		rs, err := tx.ReadRedriven("orders", "g", 0, 10)
		require.NoError(t, err)
		require.Equal(t, []uint64{2, 4}, letterSeqs(rs))
		rs, err = tx.ReadRedriven("orders", "g", 3, 10)
		require.NoError(t, err)
		require.Equal(t, []uint64{4}, letterSeqs(rs), "from 3")
		rs, err = tx.ReadRedriven("orders", "g", 0, 1)
		require.NoError(t, err)
		require.Equal(t, []uint64{2}, letterSeqs(rs))
		_, err = tx.ReadRedriven("orders", "g", 0, 0)
		require.ErrorIs(t, err, ErrInvalid)
		keys, err := tx.DeadLetterKeys("orders", "g")
		require.NoError(t, err)
		require.Equal(t, map[string]bool{"a": true, "d": true, "e": true}, keys)
		return nil
	})

	// A redriven letter fails again, then dies again: back in the DLQ.
	dead, err := fail(t, s, "orders", "g", t0+30*sec,
		Failure{Seq: 2, Redriven: true, Attempts: 1, RetryAt: t0 + 31*sec, Error: "again"},
		Failure{Seq: 7, Redriven: true, Attempts: 1, Error: "unknown redriven: skipped"})
	require.NoError(t, err)
	require.Empty(t, dead)
	view(t, s, func(tx *Tx) error {
		rs, err := tx.ReadRedriven("orders", "g", 2, 1)
		require.NoError(t, err)
		require.Equal(t, uint32(1), rs[0].Attempts)
		require.Equal(t, t0+31*sec, rs[0].RetryAt)
		require.Equal(t, "again", rs[0].LastError)
		return nil
	})
	dead, err = fail(t, s, "orders", "g", t0+40*sec, Failure{Seq: 2, Redriven: true, Attempts: 16, Error: "still", Dead: true})
	require.NoError(t, err)
	require.Equal(t, []uint64{2}, letterSeqs(dead))
	require.Equal(t, uint32(16), dead[0].Attempts)
	require.Equal(t, t0+40*sec, dead[0].DeadAt)
	require.Equal(t, int64(0), dead[0].RetryAt)
	g = getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(4), g.DeadLetters)
	require.Equal(t, uint64(1), g.Redriven)
	require.Equal(t, uint64(7), g.Redeliveries)
	checkGroup(t, s, "orders", "g")

	// Acking redriven letters: known ones go, unknown ones are ignored.
	update(t, s, func(tx *Tx) error {
		g, err := tx.Ack("orders", "g", nil, []uint64{4, 4, 2, 99})
		require.NoError(t, err)
		require.Equal(t, uint64(0), g.Redriven)
		return nil
	})
	checkGroup(t, s, "orders", "g")

	// Redrive all, with a limit; then purge.
	update(t, s, func(tx *Tx) error {
		moved, err := tx.Redrive("orders", "g", nil, true, 2)
		require.NoError(t, err)
		require.Equal(t, []uint64{1, 2}, letterSeqs(moved))
		return nil
	})
	checkGroup(t, s, "orders", "g")
	update(t, s, func(tx *Tx) error {
		n, err := tx.PurgeDeadLetters("orders", "g", []uint64{6, 6, 1, 42}, false, 0)
		require.NoError(t, err)
		require.Equal(t, 1, n, "1 is redriven, 42 unknown")
		return nil
	})
	checkGroup(t, s, "orders", "g")
	update(t, s, func(tx *Tx) error {
		n, err := tx.PurgeDeadLetters("orders", "g", nil, true, 10)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = tx.PurgeDeadLetters("orders", "g", nil, true, 10)
		require.NoError(t, err)
		require.Equal(t, 0, n)
		moved, err := tx.Redrive("orders", "g", nil, true, 10)
		require.NoError(t, err)
		require.Empty(t, moved)
		return nil
	})
	g = getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(0), g.DeadLetters)
	require.Equal(t, uint64(2), g.Redriven)
	checkGroup(t, s, "orders", "g")

	// Refusals write nothing.
	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		_, err := tx.Redrive("orders", "g", nil, true, 0)
		require.ErrorIs(t, err, ErrInvalid)
		require.ErrorContains(t, err, "limit must be > 0")
		_, err = tx.Redrive("orders", "g", []uint64{1}, true, 5)
		require.ErrorIs(t, err, ErrInvalid)
		_, err = tx.PurgeDeadLetters("orders", "g", nil, true, -1)
		require.ErrorIs(t, err, ErrInvalid)
		_, err = tx.Redrive("orders", "nobody", []uint64{1}, false, 0)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.PurgeDeadLetters("nope", "g", []uint64{1}, false, 0)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.ReadRedriven("orders", "nobody", 0, 1)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
	require.Equal(t, before, dump(t, s))
}

// A DLQ index entry names the topic: the same group on two topics keeps
// both apart.
func TestDeadLetterByIDAcrossTopics(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "")
	sendKeyed(t, s, "payments", "", "")
	createGroup(t, s, "orders", "g", GroupStart{})
	createGroup(t, s, "payments", "g", GroupStart{})
	_, err := fail(t, s, "orders", "g", t0, deadOf(1, 3))
	require.NoError(t, err)
	_, err = fail(t, s, "payments", "g", t0, deadOf(2, 3))
	require.NoError(t, err)
	view(t, s, func(tx *Tx) error {
		dl, err := tx.DeadLetterByID("g", "payments-2")
		require.NoError(t, err)
		require.Equal(t, "payments", dl.Topic)
		require.Equal(t, uint64(2), dl.Message.Sequence)
		dl, err = tx.DeadLetterByID("g", "orders-1")
		require.NoError(t, err)
		require.Equal(t, "orders", dl.Topic)
		return nil
	})
	checkGroup(t, s, "orders", "g")
	checkGroup(t, s, "payments", "g")
}

// ---- reset, lag ----

func TestResetGroup(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "", "", "", "", "", "", "", "") // 8 messages at t0+1s..t0+8s
	createGroup(t, s, "orders", "g", GroupStart{})
	require.NoError(t, ack(t, s, "orders", "g", 1, 2, 5))
	_, err := fail(t, s, "orders", "g", t0, deadOf(3, 16), retryOf(4, 1), deadOf(6, 16), retryOf(7, 2))
	require.NoError(t, err)
	update(t, s, func(tx *Tx) error {
		_, err := tx.Redrive("orders", "g", []uint64{6}, false, 0)
		return err
	})
	g := getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(3), g.AckedThrough)
	require.Equal(t, uint64(2), g.AckedAbove) // 5, 6
	require.Equal(t, uint64(2), g.Retrying)
	require.Equal(t, uint64(1), g.DeadLetters)
	require.Equal(t, uint64(1), g.Redriven)
	checkGroup(t, s, "orders", "g")

	// Back to 5s: 5.. are unacked again, retry state is gone, the redriven
	// 6 goes (the log delivers it again), the DLQ stays.
	update(t, s, func(tx *Tx) error {
		g, err := tx.ResetGroup("orders", "g", GroupStart{Time: t0 + 5*sec})
		require.NoError(t, err)
		require.Equal(t, uint64(4), g.AckedThrough)
		return nil
	})
	g = getGroup(t, s, "orders", "g")
	require.Equal(t, uint64(0), g.AckedAbove)
	require.Equal(t, uint64(0), g.Retrying)
	require.Equal(t, uint64(1), g.DeadLetters)
	require.Equal(t, uint64(0), g.Redriven)
	require.Equal(t, uint64(4), g.Redeliveries, "history is kept")
	checkGroup(t, s, "orders", "g")

	// A redriven letter below the new position stays: nothing delivers it
	// otherwise.
	update(t, s, func(tx *Tx) error {
		_, err := tx.Redrive("orders", "g", []uint64{3}, false, 0)
		require.NoError(t, err)
		g, err := tx.ResetGroup("orders", "g", GroupStart{Latest: true})
		require.NoError(t, err)
		require.Equal(t, uint64(8), g.AckedThrough)
		require.Equal(t, uint64(1), g.Redriven)
		g, err = tx.ResetGroup("orders", "g", GroupStart{})
		require.NoError(t, err)
		require.Equal(t, uint64(0), g.AckedThrough)
		require.Equal(t, uint64(0), g.Redriven)
		return nil
	})
	checkGroup(t, s, "orders", "g")

	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		_, err := tx.ResetGroup("orders", "nobody", GroupStart{})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.ResetGroup("nope", "g", GroupStart{})
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.ResetGroup("orders", "g", GroupStart{Latest: true, Time: 1})
		require.ErrorIs(t, err, ErrInvalid)
		return nil
	})
	require.Equal(t, before, dump(t, s))
}

func TestLag(t *testing.T) {
	s := openStore(t)
	lag := func(group string) GroupLag {
		t.Helper()
		var l GroupLag
		view(t, s, func(tx *Tx) error {
			var err error
			l, err = tx.Lag("orders", group)
			return err
		})
		return l
	}
	update(t, s, func(tx *Tx) error {
		_, _, err := tx.CreateTopic("orders", t0)
		return err
	})
	createGroup(t, s, "orders", "g", GroupStart{})
	require.Equal(t, GroupLag{}, lag("g"))
	sendKeyed(t, s, "orders", "", "", "", "", "") // at t0+1s..t0+5s
	require.Equal(t, GroupLag{Lag: 5, OldestUnacked: t0 + sec}, lag("g"))
	require.NoError(t, ack(t, s, "orders", "g", 1, 3))
	require.Equal(t, GroupLag{Lag: 3, OldestUnacked: t0 + 2*sec}, lag("g"))
	require.NoError(t, ack(t, s, "orders", "g", 2))
	require.Equal(t, GroupLag{Lag: 2, OldestUnacked: t0 + 4*sec}, lag("g"), "past the acks above acked_through")
	_, err := fail(t, s, "orders", "g", t0, deadOf(4, 16), deadOf(5, 16))
	require.NoError(t, err)
	require.Equal(t, GroupLag{}, lag("g"), "dead letters are not lag")
	update(t, s, func(tx *Tx) error {
		_, err := tx.Redrive("orders", "g", []uint64{5}, false, 0)
		return err
	})
	require.Equal(t, GroupLag{Lag: 1, OldestUnacked: t0 + 5*sec}, lag("g"), "redriven letters are")
	sendKeyed(t, s, "orders", "")
	require.Equal(t, GroupLag{Lag: 2, OldestUnacked: t0 + 5*sec}, lag("g"), "min over log and redriven")

	createGroup(t, s, "orders", "late", GroupStart{Latest: true})
	require.Equal(t, GroupLag{}, lag("late"))
	view(t, s, func(tx *Tx) error {
		_, err := tx.Lag("orders", "nobody")
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

// ---- delivery policy ----

func TestConsumerGroupPolicy(t *testing.T) {
	s := openStore(t)
	view(t, s, func(tx *Tx) error {
		cg, err := tx.ConsumerGroup("billing")
		require.NoError(t, err)
		protoEq(t, &storepb.ConsumerGroup{Name: "billing"}, cg, "defaults when none is stored")
		return nil
	})
	want := &storepb.ConsumerGroup{Name: "billing", MaxDeliveries: 5, AckDeadline: 10 * sec, RedeliveryBackoff: []int64{sec, 5 * sec}, OrderedPoison: 2}
	update(t, s, func(tx *Tx) error { return tx.PutConsumerGroup(want) })
	view(t, s, func(tx *Tx) error {
		cg, err := tx.ConsumerGroup("billing")
		require.NoError(t, err)
		protoEq(t, want, cg)
		return nil
	})
	before := dump(t, s)
	update(t, s, func(tx *Tx) error {
		for name, cg := range map[string]*storepb.ConsumerGroup{
			"no name":          {},
			"long name":        {Name: strings.Repeat("n", maxName+1)},
			"negative ack":     {Name: "billing", AckDeadline: -1},
			"negative backoff": {Name: "billing", RedeliveryBackoff: []int64{sec, -sec}},
			"poison policy":    {Name: "billing", OrderedPoison: 3},
		} {
			require.ErrorIs(t, tx.PutConsumerGroup(cg), ErrInvalid, name)
		}
		return nil
	})
	require.Equal(t, before, dump(t, s))
}

// ---- a random walk, checked against the invariants ----

// Random acks, failures, redrives, purges, resets, trims and sends on two
// groups: after every step the counters match the buckets, and applying the
// steps one Update each or all in one gives the same store.
func TestGroupOpsRandomWalk(t *testing.T) {
	one, batched := openStore(t), openStore(t)
	type step func(tx *Tx) error
	rng := rand.New(rand.NewPCG(3, 4))
	var steps []step
	last := uint64(0)
	for i := 0; i < 400; i++ {
		g := []string{"g", "h"}[rng.IntN(2)]
		var seqs []uint64
		for j := rng.IntN(4); j > 0 && last > 0; j-- {
			seqs = append(seqs, 1+rng.Uint64N(last))
		}
		now := t0 + int64(i)*sec
		switch op := rng.IntN(10); {
		case op < 2 || last == 0:
			last++
			id := fmt.Sprintf("m%d", last)
			key := fmt.Sprintf("k%d", rng.IntN(3))
			steps = append(steps, func(tx *Tx) error {
				_, _, err := tx.Send("orders", &storepb.Message{Id: id, OrderingKey: key}, false, 0, now)
				return err
			})
		case op < 4:
			redriven := []uint64{}
			if len(seqs) > 0 {
				redriven = seqs[:1]
			}
			// Trimmed sequences among them are acked already.
			steps = append(steps, func(tx *Tx) error {
				_, err := tx.Ack("orders", g, seqs, redriven)
				return err
			})
		case op < 6:
			var fs []Failure
			for _, sq := range seqs {
				fs = append(fs, Failure{Seq: sq, Redriven: rng.IntN(4) == 0, Attempts: uint32(1 + rng.IntN(5)), RetryAt: now, Error: "x", Dead: rng.IntN(3) == 0})
			}
			steps = append(steps, func(tx *Tx) error {
				_, _, err := tx.RecordFailures("orders", g, fs, now)
				return err
			})
		case op < 7:
			all := rng.IntN(2) == 0
			if all {
				seqs = nil
			}
			steps = append(steps, func(tx *Tx) error {
				_, err := tx.Redrive("orders", g, seqs, all, 2)
				return err
			})
		case op < 8:
			steps = append(steps, func(tx *Tx) error {
				_, err := tx.PurgeDeadLetters("orders", g, seqs, false, 0)
				return err
			})
		case op < 9:
			start := []GroupStart{{}, {Latest: true}, {Time: t0 + rng.Int64N(int64(i+1))*sec}}[rng.IntN(3)]
			steps = append(steps, func(tx *Tx) error {
				_, err := tx.ResetGroup("orders", g, start)
				return err
			})
		default:
			through := rng.Uint64N(last + 1)
			steps = append(steps, func(tx *Tx) error {
				_, err := tx.Trim("orders", through, 3)
				return err
			})
		}
	}
	for _, s := range []*Store{one, batched} {
		update(t, s, func(tx *Tx) error {
			if _, _, err := tx.CreateTopic("orders", t0); err != nil {
				return err
			}
			for _, g := range []string{"g", "h"} {
				if _, _, err := tx.CreateGroup("orders", g, GroupStart{}, t0, false); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for i, st := range steps {
		require.NoError(t, one.Update(st), "step %d", i)
		checkTopic(t, one, "orders")
		checkGroup(t, one, "orders", "g")
		checkGroup(t, one, "orders", "h")
	}
	update(t, batched, func(tx *Tx) error {
		for _, st := range steps {
			if err := st(tx); err != nil {
				return err
			}
		}
		return nil
	})
	require.Equal(t, dump(t, one), dump(t, batched))
	g := getGroup(t, one, "orders", "g")
	t.Logf("group g after the walk: %v", g)
	require.NotZero(t, g.Redeliveries)
	require.NotZero(t, g.Dropped+getGroup(t, one, "orders", "h").Dropped)
}

// A group created before the retry, dlq and redrive buckets existed (a
// version 0 store) gets them from the migration to version 1.
func TestGroupWithoutNewBuckets(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "", "")
	createGroup(t, s, "orders", "g", GroupStart{})
	s = asVersion0(t, s, func(btx *bolt.Tx) error {
		gb := btx.Bucket(bktTopics).Bucket([]byte("orders")).Bucket(bktGroups).Bucket([]byte("g"))
		for _, name := range [][]byte{bktRetry, bktDLQ, bktRedrive} {
			if err := gb.DeleteBucket(name); err != nil {
				return err
			}
		}
		return nil
	})
	view(t, s, func(tx *Tx) error {
		r, err := tx.Retry("orders", "g", 1)
		require.NoError(t, err)
		require.Nil(t, r)
		dls, err := tx.DeadLetters("orders", "g", 0, 10)
		require.NoError(t, err)
		require.Empty(t, dls)
		rs, err := tx.ReadRedriven("orders", "g", 0, 10)
		require.NoError(t, err)
		require.Empty(t, rs)
		keys, err := tx.DeadLetterKeys("orders", "g")
		require.NoError(t, err)
		require.Empty(t, keys)
		_, err = tx.DeadLetter("orders", "g", 1)
		require.ErrorIs(t, err, ErrNotFound)
		l, err := tx.Lag("orders", "g")
		require.NoError(t, err)
		require.Equal(t, uint64(2), l.Lag)
		return nil
	})
	_, err := fail(t, s, "orders", "g", t0, retryOf(2, 1), deadOf(1, 2))
	require.NoError(t, err)
	update(t, s, func(tx *Tx) error {
		_, err := tx.Redrive("orders", "g", nil, true, 1)
		return err
	})
	checkGroup(t, s, "orders", "g")
	g := getGroup(t, s, "orders", "g")
	require.True(t, proto.Equal(g, &storepb.Group{Topic: "orders", Name: "g", CreatedAt: t0, AckedThrough: 1, Redeliveries: 2, Retrying: 1, Redriven: 1}), "%v", g)
}
