package halfstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Where FuzzDecodeRecords puts its bytes: one stored value each.
const (
	fzPendingHalf = iota
	fzCommittedHalf
	fzLogMessage
	fzGroupMeta
	fzTopicMeta
	fzDedup
	fzAppliedIndex
	fzIndexedHalf // a record that only the indexes point at
	fzRetry
	fzDeadLetter
	fzRedriven
	fzConsumerGroup
	fzDLQIndex
	fzTargets
)

// fuzzStore builds a small store through the API and closes it: topic
// "orders" with a committed half message (sequence 1) and a keyed plain
// message (sequence 2), a pending half message, consumer group "g" (with 1
// dead and 2 failed once, and a delivery policy) and group "g2" (with 1
// redriven).
func fuzzStore(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "txmq.db")
	s, err := Open(path)
	require.NoError(t, err)
	require.NoError(t, s.Update(func(tx *Tx) error {
		if _, _, err := tx.PutHalf(half("h1", "pg", "tx1"), true); err != nil {
			return err
		}
		if _, _, err := tx.PutHalf(half("h2", "pg", "tx2"), true); err != nil {
			return err
		}
		if _, _, err := tx.Resolve("h2", Commit, byProducer, t0+sec); err != nil {
			return err
		}
		if _, _, err := tx.Send("orders", &storepb.Message{Id: "s1", Key: "k", Body: []byte("x")}, true, 10*sec, t0+sec); err != nil {
			return err
		}
		for _, g := range []string{"g", "g2"} {
			if _, _, err := tx.CreateGroup("orders", g, GroupStart{}, t0, false); err != nil {
				return err
			}
			if _, _, err := tx.RecordFailures("orders", g, []Failure{retryOf(2, 1), deadOf(1, 2)}, t0); err != nil {
				return err
			}
		}
		if _, err := tx.Redrive("orders", "g2", []uint64{1}, false, 0); err != nil {
			return err
		}
		if err := tx.PutConsumerGroup(&storepb.ConsumerGroup{Name: "g", MaxDeliveries: 3}); err != nil {
			return err
		}
		return tx.SetAppliedIndex(7)
	}))
	require.NoError(t, s.Close())
	return path
}

// putRaw writes raw bytes under one stored value with bbolt directly.
func putRaw(t testing.TB, path string, target int, raw []byte) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	defer db.Close()
	require.NoError(t, db.Update(func(btx *bolt.Tx) error {
		orders := btx.Bucket(bktTopics).Bucket([]byte("orders"))
		switch target {
		case fzPendingHalf:
			return btx.Bucket(bktHalf).Put([]byte("h1"), raw)
		case fzCommittedHalf:
			return btx.Bucket(bktHalf).Put([]byte("h2"), raw)
		case fzLogMessage:
			return orders.Bucket(bktLog).Put(u64(1), raw)
		case fzGroupMeta:
			return orders.Bucket(bktGroups).Bucket([]byte("g")).Put(keyMeta, raw)
		case fzTopicMeta:
			return orders.Put(keyMeta, raw)
		case fzDedup:
			return btx.Bucket(bktDedup).Put([]byte("orders\x00k"), raw)
		case fzAppliedIndex:
			return btx.Bucket(bktMeta).Put(keyApplied, raw)
		case fzRetry:
			return orders.Bucket(bktGroups).Bucket([]byte("g")).Bucket(bktRetry).Put(u64(2), raw)
		case fzDeadLetter:
			return orders.Bucket(bktGroups).Bucket([]byte("g")).Bucket(bktDLQ).Put(u64(1), raw)
		case fzRedriven:
			return orders.Bucket(bktGroups).Bucket([]byte("g2")).Bucket(bktRedrive).Put(u64(1), raw)
		case fzConsumerGroup:
			return btx.Bucket(bktCGroups).Put([]byte("g"), raw)
		case fzDLQIndex:
			return btx.Bucket(bktDLQIDs).Put(dlqIDKey("g", "h2"), raw)
		case fzIndexedHalf:
			if err := btx.Bucket(bktHalf).Put([]byte("h9"), raw); err != nil {
				return err
			}
			if err := btx.Bucket(bktHalfTx).Put(txKey("pg", "tx9"), []byte("h9")); err != nil {
				return err
			}
			return btx.Bucket(bktHalfState).Put(stateKey(pending, "h9"), nil)
		}
		return fmt.Errorf("no target %d", target)
	}))
}

// decodes tells whether raw is a valid record of m's type, and leaves the
// decoded record in m.
func decodes(raw []byte, m proto.Message) bool { return proto.Unmarshal(raw, m) == nil }

// oneOf checks a read of a corrupt-able record: an error that is not "not
// found" when the bytes do not decode, else exactly the decoded record.
func oneOf(t *testing.T, what string, raw []byte, want, got proto.Message, err error) {
	t.Helper()
	if !decodes(raw, want) {
		require.True(t, err != nil, "%s: corrupt record read without error", what)
		require.True(t, !errors.Is(err, ErrNotFound), "%s: corrupt record reported as not found: %v", what, err)
		return
	}
	require.NoError(t, err, what)
	protoEq(t, want, got, what)
}

var errRollback = errors.New("roll back")

func FuzzDecodeRecords(f *testing.F) {
	valid := map[int]proto.Message{
		fzPendingHalf:   half("h1", "pg", "tx1"),
		fzCommittedHalf: &storepb.Half{Id: "h2", Topic: "orders", ProducerGroup: "pg", TransactionId: "tx2", State: committed, Sequence: 1},
		fzLogMessage:    &storepb.Message{Id: "h2", Sequence: 1, Body: []byte("b"), Properties: map[string]string{"a": "b"}},
		fzGroupMeta:     &storepb.Group{Topic: "orders", Name: "g", AckedThrough: 1, AckedAbove: 3},
		fzTopicMeta:     &storepb.Topic{Name: "orders", LastSequence: 2},
		fzDedup:         &storepb.Dedup{MessageId: "s1", Sequence: 2, SentAt: t0},
		fzIndexedHalf:   &storepb.Half{Id: "h9", Topic: "orders", ProducerGroup: "pg", TransactionId: "tx9", State: expired},
		fzRetry:         &storepb.Retry{Attempts: 2, RetryAt: t0, LastError: "e"},
		fzDeadLetter:    &storepb.DeadLetter{Message: &storepb.Message{Id: "h2", Sequence: 1, OrderingKey: "k"}, Topic: "orders", Group: "g", Attempts: 3},
		fzRedriven:      &storepb.DeadLetter{Message: &storepb.Message{Id: "h2", Sequence: 1}, Topic: "orders", Group: "g2", RetryAt: t0},
		fzConsumerGroup: &storepb.ConsumerGroup{Name: "g", MaxDeliveries: 5, RedeliveryBackoff: []int64{1, 2}},
	}
	for target := 0; target < fzTargets; target++ {
		if m, ok := valid[target]; ok {
			b, err := proto.Marshal(m)
			require.NoError(f, err)
			f.Add(uint8(target), b)
			f.Add(uint8(target), b[:len(b)/2]) // cut inside a field
		}
		f.Add(uint8(target), []byte{})
		f.Add(uint8(target), []byte{0xff, 0xff, 0xff})                                                 // bad tag
		f.Add(uint8(target), []byte{0x0a, 0x7f, 'x'})                                                  // length past the end
		f.Add(uint8(target), []byte{0x48, 0x63})                                                       // state / sequence 99
		f.Add(uint8(target), []byte{0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}) // field 3 = max uint64
		f.Add(uint8(target), []byte{0x12, 0x02, 0xc3, 0x28})                                           // invalid UTF-8 in a string
	}
	f.Add(uint8(fzAppliedIndex), u64(1<<63))
	f.Add(uint8(fzDLQIndex), append([]byte("orders\x00"), u64(1)...))
	f.Add(uint8(fzDLQIndex), append([]byte("nope\x00"), u64(1)...))
	f.Add(uint8(fzDLQIndex), u64(1))

	f.Fuzz(func(t *testing.T, target uint8, raw []byte) {
		tg := int(target) % fzTargets
		path := fuzzStore(t)
		putRaw(t, path, tg, raw)
		s, err := Open(path)
		require.NoError(t, err, "Open after a corrupt value")
		defer s.Close()

		// Reads: every one gives a value or an error, never a panic.
		require.NoError(t, s.View(func(tx *Tx) error {
			h, err := tx.Half("h1")
			if tg == fzPendingHalf {
				oneOf(t, "Half(h1)", raw, &storepb.Half{}, h, err)
			}
			require.True(t, (h == nil) != (err == nil), "Half(h1): %v, %v", h, err)
			h, err = tx.Half("h2")
			if tg == fzCommittedHalf {
				oneOf(t, "Half(h2)", raw, &storepb.Half{}, h, err)
			}
			require.True(t, (h == nil) != (err == nil), "Half(h2): %v, %v", h, err)
			h, err = tx.Half("h9")
			if tg == fzIndexedHalf {
				oneOf(t, "Half(h9)", raw, &storepb.Half{}, h, err)
			}
			m, err := tx.Message("orders", 1)
			if tg == fzLogMessage {
				oneOf(t, "Message(orders, 1)", raw, &storepb.Message{}, m, err)
			}
			require.True(t, (m == nil) != (err == nil), "Message: %v, %v", m, err)
			ms, err := tx.ReadTopic("orders", 0, 10)
			if tg == fzLogMessage && !decodes(raw, &storepb.Message{}) {
				require.True(t, err != nil, "ReadTopic over a corrupt message")
			} else {
				require.NoError(t, err, "ReadTopic")
				require.Equal(t, 2, len(ms))
			}
			g, err := tx.Group("orders", "g")
			if tg == fzGroupMeta {
				oneOf(t, "Group(orders, g)", raw, &storepb.Group{}, g, err)
			}
			require.True(t, (g == nil) != (err == nil), "Group: %v, %v", g, err)
			tp, err := tx.Topic("orders")
			if tg == fzTopicMeta {
				oneOf(t, "Topic(orders)", raw, &storepb.Topic{}, tp, err)
			}
			require.True(t, (tp == nil) != (err == nil), "Topic: %v, %v", tp, err)
			if tg == fzAppliedIndex {
				want := uint64(0)
				if len(raw) == 8 {
					want = binary.BigEndian.Uint64(raw)
				}
				require.Equal(t, want, tx.AppliedIndex())
			} else {
				require.Equal(t, uint64(7), tx.AppliedIndex())
			}

			for _, st := range []storepb.HalfState{anyState, pending, committed, rolledBack, expired} {
				for _, group := range []string{"", "pg"} {
					hs, err := tx.ListHalf(group, st, "", 100)
					if err == nil {
						for _, h := range hs {
							require.True(t, h != nil)
						}
					}
					_, _ = tx.ListHalf(group, st, "h1", 1)
				}
			}
			_, _ = tx.Topics()
			_, _ = tx.Groups("orders")
			_, _ = tx.GroupTopics("g")
			_, _ = tx.AckedAbove("orders", "g")
			_, _ = tx.IsAcked("orders", "g", 1)
			_, _ = tx.HalfIDByTx("pg", "tx9")

			r, err := tx.Retry("orders", "g", 2)
			if tg == fzRetry {
				oneOf(t, "Retry(orders, g, 2)", raw, &storepb.Retry{}, r, err)
			}
			dl, err := tx.DeadLetter("orders", "g", 1)
			if tg == fzDeadLetter {
				oneOf(t, "DeadLetter(orders, g, 1)", raw, &storepb.DeadLetter{}, dl, err)
			}
			require.True(t, (dl == nil) != (err == nil), "DeadLetter: %v, %v", dl, err)
			cg, err := tx.ConsumerGroup("g")
			if tg == fzConsumerGroup {
				oneOf(t, "ConsumerGroup(g)", raw, &storepb.ConsumerGroup{}, cg, err)
			}
			require.True(t, (cg == nil) != (err == nil), "ConsumerGroup: %v, %v", cg, err)
			dl, err = tx.DeadLetterByID("g", "h2")
			require.True(t, (dl == nil) != (err == nil), "DeadLetterByID: %v, %v", dl, err)
			rds, err := tx.ReadRedriven("orders", "g2", 0, 10)
			if tg == fzRedriven {
				if decodes(raw, &storepb.DeadLetter{}) {
					require.NoError(t, err, "ReadRedriven")
					require.Len(t, rds, 1)
				} else {
					require.True(t, err != nil, "ReadRedriven over a corrupt letter")
				}
			}
			_, _ = tx.DeadLetters("orders", "g", 0, 10)
			_, _ = tx.DeadLetterKeys("orders", "g")
			_, _ = tx.Lag("orders", "g")
			_, _ = tx.Lag("orders", "g2")
			_, _ = tx.StartSeq("orders", GroupStart{Time: t0})
			_, _ = tx.TrimPoint("orders", t0+sec, 1, 10)
			return nil
		}))

		// Writes over the corrupt record refuse or succeed, never panic.
		// The transaction is rolled back: only the absence of a panic counts.
		err = s.Update(func(tx *Tx) error {
			_, _, _ = tx.PutHalf(half("h3", "pg", "tx1"), true) // duplicate of h1
			_, _, _ = tx.PutHalf(half("h4", "pg", "tx9"), true) // duplicate of h9
			_, _, _ = tx.PutHalf(half("h5", "pg", "tx5"), true)
			_, _, _ = tx.Resolve("h1", Commit, byProducer, t0+2*sec)
			_, _, _ = tx.Resolve("h9", Commit, byOperator, t0+2*sec)
			_, _, _ = tx.Resolve("h2", Rollback, byProducer, t0+2*sec)
			_, _, _ = tx.Expire("h5", t0+2*sec, false)
			_, _, _ = tx.Send("orders", &storepb.Message{Id: "s2", Key: "k"}, true, 10*sec, t0+2*sec)
			_, _, _ = tx.Send("orders", &storepb.Message{Id: "s3"}, true, 10*sec, t0+2*sec)
			_, _, _ = tx.CreateTopic("orders", t0)
			_, _, _ = tx.CreateGroup("orders", "g", GroupStart{Latest: true}, t0, false)
			_, _, _ = tx.CreateGroup("orders", "g2", GroupStart{Latest: true}, t0, false)
			_, _ = tx.Ack("orders", "g", []uint64{1, 2}, nil)
			_, _ = tx.ListHalf("", anyState, "", 100)
			_, _, _ = tx.RecordFailures("orders", "g", []Failure{retryOf(2, 2), deadOf(2, 3)}, t0)
			_, _, _ = tx.RecordFailures("orders", "g2", []Failure{{Seq: 1, Redriven: true, Attempts: 1, Dead: true}}, t0)
			_, _ = tx.Ack("orders", "g2", nil, []uint64{1})
			_, _ = tx.Redrive("orders", "g", nil, true, 10)
			_, _ = tx.PurgeDeadLetters("orders", "g", []uint64{1}, false, 0)
			_, _ = tx.ResetGroup("orders", "g", GroupStart{Time: t0})
			_ = tx.PutConsumerGroup(&storepb.ConsumerGroup{Name: "g"})
			_, _ = tx.Trim("orders", 2, 10)
			_, _, _ = tx.Prune(t0+10*sec, t0+10*sec, 10)
			return errRollback
		})
		require.ErrorIs(t, err, errRollback)
	})
}

// Keys are written by the store only, but a corrupt file should give errors,
// not a crash.
func TestCorruptKeysDoNotPanic(t *testing.T) {
	path := fuzzStore(t)
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(btx *bolt.Tx) error {
		orders := btx.Bucket(bktTopics).Bucket([]byte("orders"))
		if err := orders.Bucket(bktGroups).Bucket([]byte("g")).Bucket(bktAcked).Put([]byte{1}, nil); err != nil {
			return err
		}
		// Sorts after sequences 1 and 2, so ReadTopic from 0 reaches it.
		return orders.Bucket(bktLog).Put([]byte{0, 0, 0, 0, 0, 0, 1}, []byte{0xff})
	}))
	require.NoError(t, db.Close())
	s := openAt(t, path)

	noPanic := func(name string, fn func(tx *Tx) error) {
		t.Helper()
		var perr any
		err := s.View(func(tx *Tx) error {
			defer func() { perr = recover() }()
			return fn(tx)
		})
		if perr != nil {
			t.Errorf("%s panicked: %v", name, perr)
		} else if err == nil {
			t.Errorf("%s read a corrupt key without error", name)
		}
	}
	noPanic("AckedAbove", func(tx *Tx) error {
		_, err := tx.AckedAbove("orders", "g")
		return err
	})
	noPanic("ReadTopic", func(tx *Tx) error {
		_, err := tx.ReadTopic("orders", 0, 10)
		return err
	})
}
