package halfstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// writeBolt changes the file of a closed store with bbolt directly.
func writeBolt(t testing.TB, path string, fn func(btx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(fn))
	require.NoError(t, db.Close())
}

// asVersion0 closes s, turns it into a version 0 store (no schema version,
// and the older shape that shape writes) and opens it again, which migrates
// it.
func asVersion0(t testing.TB, s *Store, shape func(btx *bolt.Tx) error) *Store {
	t.Helper()
	require.NoError(t, s.Close())
	writeBolt(t, s.Path(), func(btx *bolt.Tx) error {
		if err := btx.Bucket(bktMeta).Delete(keySchemaVersion); err != nil {
			return err
		}
		return shape(btx)
	})
	return openAt(t, s.Path())
}

func schemaVersion(t testing.TB, s *Store) uint64 {
	t.Helper()
	var v uint64
	view(t, s, func(tx *Tx) error {
		var err error
		v, _, err = storedVersion(tx.tx)
		return err
	})
	return v
}

// The contents of the version 0 store that writeVersion0 builds.
var (
	v0Messages = []*storepb.Message{
		{Id: "s1", Sequence: 1, Body: []byte("one"), CommittedAt: t0 + 1*sec},
		{Id: "s2", Sequence: 2, Body: []byte("two"), CommittedAt: t0 + 2*sec},
		{Id: "s3", Sequence: 3, Body: []byte("three"), CommittedAt: t0 + 3*sec, OrderingKey: "k"},
	}
	v0Policy = &storepb.ProducerGroup{Name: "pg", MaxChecks: 3}
)

func v0Half() *storepb.Half {
	h := half("h1", "pg", "tx1")
	h.State = pending
	h.BodySize = uint32(len(h.Body))
	h.NextCheckAt = h.CreatedAt + h.CheckAfter
	return h
}

// writeVersion0 writes, with bbolt alone, a store as code before schema
// versions left it: only the root buckets of the first layout, topics
// whose first_sequence and bytes were never set, a consumer group with only
// its meta and acked buckets (one ack above acked_through), a pending half
// message with its indexes, a producer group policy and an applied index.
func writeVersion0(t testing.TB, path string) {
	t.Helper()
	writeBolt(t, path, func(btx *bolt.Tx) error {
		for _, name := range [][]byte{bktMeta, bktHalf, bktHalfTx, bktHalfState, bktHalfSched, bktDedup, bktTopics, bktPGroups} {
			if _, err := btx.CreateBucket(name); err != nil {
				return err
			}
		}
		if err := btx.Bucket(bktMeta).Put(keyApplied, u64(42)); err != nil {
			return err
		}
		topics := btx.Bucket(bktTopics)
		orders, err := topics.CreateBucket([]byte("orders"))
		require.NoError(t, err)
		require.NoError(t, put(orders, keyMeta, &storepb.Topic{Name: "orders", CreatedAt: t0, LastSequence: 3}))
		log, err := orders.CreateBucket(bktLog)
		require.NoError(t, err)
		for _, m := range v0Messages {
			require.NoError(t, put(log, u64(m.Sequence), m))
		}
		groups, err := orders.CreateBucket(bktGroups)
		require.NoError(t, err)
		g, err := groups.CreateBucket([]byte("g"))
		require.NoError(t, err)
		require.NoError(t, put(g, keyMeta, &storepb.Group{Topic: "orders", Name: "g", CreatedAt: t0, AckedAbove: 1}))
		acked, err := g.CreateBucket(bktAcked)
		require.NoError(t, err)
		require.NoError(t, acked.Put(u64(2), present))

		empty, err := topics.CreateBucket([]byte("empty"))
		require.NoError(t, err)
		require.NoError(t, put(empty, keyMeta, &storepb.Topic{Name: "empty", CreatedAt: t0}))
		for _, sub := range [][]byte{bktLog, bktGroups} {
			_, err := empty.CreateBucket(sub)
			require.NoError(t, err)
		}

		h := v0Half()
		require.NoError(t, put(btx.Bucket(bktHalf), []byte(h.Id), h))
		require.NoError(t, btx.Bucket(bktHalfTx).Put(txKey(h.ProducerGroup, h.TransactionId), []byte(h.Id)))
		require.NoError(t, btx.Bucket(bktHalfState).Put(stateKey(pending, h.Id), present))
		sched, err := btx.Bucket(bktHalfSched).CreateBucket([]byte(h.ProducerGroup))
		require.NoError(t, err)
		require.NoError(t, sched.Put(schedKey(h.NextCheckAt, h.Id), present))
		return put(btx.Bucket(bktPGroups), []byte(v0Policy.Name), v0Policy)
	})
}

// buildTwin writes the contents of writeVersion0 through the API, into a
// store created at the current version.
func buildTwin(t testing.TB) *Store {
	t.Helper()
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		for _, name := range []string{"orders", "empty"} {
			if _, _, err := tx.CreateTopic(name, t0); err != nil {
				return err
			}
		}
		if _, _, err := tx.CreateGroup("orders", "g", GroupStart{}, t0, false); err != nil {
			return err
		}
		for _, m := range v0Messages {
			in := &storepb.Message{Id: m.Id, Body: m.Body, OrderingKey: m.OrderingKey}
			if _, _, err := tx.Send("orders", in, false, 0, m.CommittedAt); err != nil {
				return err
			}
		}
		if _, err := tx.Ack("orders", "g", []uint64{2}, nil); err != nil {
			return err
		}
		if _, _, err := tx.PutHalf(half("h1", "pg", "tx1"), false); err != nil {
			return err
		}
		if err := tx.PutProducerGroup(v0Policy); err != nil {
			return err
		}
		return tx.SetAppliedIndex(42)
	})
	return s
}

// afterMigration is what the code does with a store, to run on a migrated
// one and a new one alike: every kind of write on topics, groups, dead
// letters, half messages and retention, one transaction each.
var afterMigration = []func(tx *Tx) error{
	func(tx *Tx) error { _, err := tx.Ack("orders", "g", []uint64{1, 3}, nil); return err },
	func(tx *Tx) error {
		for _, id := range []string{"s4", "s5", "s6"} {
			if _, _, err := tx.Send("orders", &storepb.Message{Id: id, Key: "key-" + id}, false, 10*sec, t0+10*sec); err != nil {
				return err
			}
		}
		_, _, err := tx.Send("empty", &storepb.Message{Id: "e1"}, false, 0, t0+10*sec)
		return err
	},
	func(tx *Tx) error {
		_, _, err := tx.CreateGroup("empty", "h", GroupStart{}, t0+11*sec, false)
		return err
	},
	func(tx *Tx) error {
		_, _, err := tx.RecordFailures("orders", "g", []Failure{retryOf(4, 1), deadOf(5, 2), deadOf(6, 2)}, t0+12*sec)
		return err
	},
	func(tx *Tx) error { _, err := tx.Redrive("orders", "g", []uint64{5}, false, 0); return err },
	func(tx *Tx) error {
		_, _, err := tx.RecordFailures("orders", "g", []Failure{{Seq: 5, Redriven: true, Attempts: 1, RetryAt: t0 + 20*sec}}, t0+13*sec)
		return err
	},
	func(tx *Tx) error { _, err := tx.PurgeDeadLetters("orders", "g", nil, true, 10); return err },
	func(tx *Tx) error { _, _, err := tx.Resolve("h1", Commit, byCheckback, t0+14*sec); return err },
	func(tx *Tx) error { _, err := tx.Trim("orders", 4, 10); return err },
	func(tx *Tx) error { _, err := tx.ResetGroup("orders", "g", GroupStart{Time: t0 + 10*sec}); return err },
	func(tx *Tx) error {
		if _, _, err := tx.PutHalf(half("h2", "pg", "tx2"), false); err != nil {
			return err
		}
		if _, err := tx.RecordCheck("h2", true, "no answer", t0+20*sec); err != nil {
			return err
		}
		if _, _, err := tx.Expire("h2", t0+30*sec, false); err != nil {
			return err
		}
		_, _, err := tx.Resolve("h2", Rollback, byOperator, t0+31*sec)
		return err
	},
	func(tx *Tx) error { _, _, err := tx.Prune(t0+60*sec, t0+60*sec, 10); return err },
	func(tx *Tx) error { _, err := tx.Ack("orders", "g", []uint64{4, 5, 6, 7}, []uint64{5}); return err },
	func(tx *Tx) error {
		if err := tx.SetNode("n1", "127.0.0.1:7000", ""); err != nil {
			return err
		}
		return tx.PutConsumerGroup(&storepb.ConsumerGroup{Name: "g", MaxDeliveries: 4})
	},
	func(tx *Tx) error { return tx.SetAppliedIndex(43) },
}

// A version 0 store opens, is migrated to the current version with its
// applied index untouched, holds exactly what a new store given the same
// contents through the API holds, and then behaves exactly like it.
func TestVersion0StoreMigrates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "txmq.db")
	writeVersion0(t, path)
	old := openAt(t, path)
	twin := buildTwin(t)

	require.Equal(t, SchemaVersion, schemaVersion(t, old))
	idx, err := old.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(42), idx, "the migration left the applied index alone")
	require.Equal(t, dump(t, twin), dump(t, old), "the migrated store differs from a new one with the same contents")
	view(t, old, func(tx *Tx) error {
		tp, err := tx.Topic("empty")
		require.NoError(t, err)
		require.Equal(t, uint64(1), tp.FirstSequence, "an empty topic starts at the next sequence to come")
		return nil
	})

	for i, op := range afterMigration {
		update(t, old, op)
		update(t, twin, op)
		require.Equal(t, dump(t, twin), dump(t, old), "after operation %d", i)
	}
	for _, s := range []*Store{old, twin} {
		checkTopic(t, s, "orders")
		checkTopic(t, s, "empty")
		checkGroup(t, s, "orders", "g")
		checkGroup(t, s, "empty", "h")
	}
	g := getGroup(t, old, "orders", "g")
	require.Equal(t, uint64(4), g.Redeliveries, "every failure was recorded")
	require.Zero(t, g.DeadLetters+g.Redriven, "the dead letters were purged, the redriven one acked")
	require.Equal(t, []string{"h1"}, ids(readTopic(t, old, "orders", 7, 10)), "the committed half message is in the log")
}

// A new store is created at the current version, with every root bucket:
// exactly what an empty version 0 store migrates to.
func TestNewStoreIsAtCurrentVersion(t *testing.T) {
	s := openStore(t)
	require.Equal(t, SchemaVersion, schemaVersion(t, s))
	view(t, s, func(tx *Tx) error {
		for _, name := range [][]byte{bktMeta, bktHalf, bktHalfTx, bktHalfState, bktHalfRes, bktDedup, bktDedupTime,
			bktTopics, bktHalfSched, bktPGroups, bktCGroups, bktNodes, bktDLQIDs} {
			require.NotNil(t, tx.tx.Bucket(name), "root bucket %s", name)
		}
		return nil
	})
	path := filepath.Join(t.TempDir(), "txmq.db")
	writeBolt(t, path, func(btx *bolt.Tx) error {
		_, err := btx.CreateBucket(bktMeta)
		return err
	})
	require.Equal(t, dump(t, s), dump(t, openAt(t, path)))
}

// Reopening a migrated store changes nothing, not a byte of the file, and
// running the step again on it changes no content.
func TestMigrationIdempotentAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "txmq.db")
	writeVersion0(t, path)
	s := openAt(t, path)
	want := dump(t, s)
	require.NoError(t, s.Close())
	file, err := os.ReadFile(path)
	require.NoError(t, err)

	s = openAt(t, path)
	require.Equal(t, want, dump(t, s))
	require.NoError(t, s.Close())
	again, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(file, again), "opening a store at the current version wrote to it")

	s = openAt(t, path)
	update(t, s, func(tx *Tx) error { return migrateTo1(tx.tx) })
	require.Equal(t, want, dump(t, s), "the step is not idempotent")
}

// A step that fails leaves the store as it was, at its old version.
func TestFailedMigrationChangesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "txmq.db")
	writeVersion0(t, path)
	writeBolt(t, path, func(btx *bolt.Tx) error {
		return btx.Bucket(bktTopics).Bucket([]byte("empty")).Put(keyMeta, []byte{0xff, 0xff})
	})
	before := dumpFile(t, path)
	_, err := Open(path)
	require.ErrorContains(t, err, "migrate to schema version 1")
	require.ErrorContains(t, err, `topic "empty"`)
	require.Equal(t, before, dumpFile(t, path))
}

// dumpFile is dump for a closed store's file.
func dumpFile(t testing.TB, path string) []string {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	require.NoError(t, err)
	defer db.Close()
	var out []string
	require.NoError(t, db.View(func(btx *bolt.Tx) error {
		out = dumpBolt(t, btx)
		return nil
	}))
	return out
}

// A store of a newer version (or with a version that does not decode) is
// refused, by Open, OpenUnsynced and Restore alike, and left as it was.
func TestNewerSchemaIsRefused(t *testing.T) {
	for name, raw := range map[string][]byte{
		"newer":   u64(SchemaVersion + 1),
		"corrupt": {0, 1, 2},
	} {
		t.Run(name, func(t *testing.T) {
			s := openStore(t)
			workload(t, s, 0, 5)
			require.NoError(t, s.Close())
			writeBolt(t, s.Path(), func(btx *bolt.Tx) error { return btx.Bucket(bktMeta).Put(keySchemaVersion, raw) })
			file, err := os.ReadFile(s.Path())
			require.NoError(t, err)

			check := func(err error) {
				t.Helper()
				require.Error(t, err)
				if name == "newer" {
					require.ErrorIs(t, err, ErrNewerSchema)
					require.ErrorContains(t, err, "written by a newer txmq")
					require.ErrorContains(t, err, fmt.Sprintf("knows versions up to %d", SchemaVersion))
				} else {
					require.ErrorContains(t, err, "corrupt schema version 000102")
				}
			}
			_, err = Open(s.Path())
			check(err)
			setBootID(t, "boot-1")
			_, _, err = OpenUnsynced(s.Path(), "")
			check(err)
			after, err := os.ReadFile(s.Path())
			require.NoError(t, err)
			require.True(t, bytes.Equal(file, after), "a refused store was written to")

			other := openStore(t)
			workload(t, other, 0, 3)
			before := dump(t, other)
			check(other.Restore(bytes.NewReader(frameSnapshot(file))))
			require.Equal(t, before, dump(t, other), "a refused snapshot changed the store")
			noTempFiles(t, other)
		})
	}
}

// frameSnapshot frames a store file as Snapshot.WriteTo does.
func frameSnapshot(image []byte) []byte {
	out := append([]byte{}, snapMagic...)
	out = binary.BigEndian.AppendUint64(out, uint64(len(image)))
	out = append(out, image...)
	sum := sha256.Sum256(image)
	return append(out, sum[:]...)
}

// Restoring a snapshot of a version 0 store migrates it: the store is then
// what a new one with the same contents is.
func TestRestoreMigratesOldSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.db")
	writeVersion0(t, path)
	image, err := os.ReadFile(path)
	require.NoError(t, err)

	s := openStore(t)
	workload(t, s, 0, 10)
	require.NoError(t, s.Restore(bytes.NewReader(frameSnapshot(image))))
	noTempFiles(t, s)
	require.Equal(t, SchemaVersion, schemaVersion(t, s))
	require.Equal(t, dump(t, buildTwin(t)), dump(t, s))
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(42), idx)

	s = reopen(t, s)
	require.Equal(t, dump(t, buildTwin(t)), dump(t, s), "the migration was not kept")
}
