package halfstore

import (
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// putHalfErr runs PutHalf and returns its refusal, committing nothing else.
func putHalfErr(t *testing.T, s *Store, h *storepb.Half) error {
	t.Helper()
	var refused error
	update(t, s, func(tx *Tx) error {
		_, _, refused = tx.PutHalf(h, true)
		return nil
	})
	return refused
}

// A transaction ID names one message: a repeat with the same topic and
// body is a duplicate, before and after resolution (the body is dropped,
// its hash kept); one with another body or topic is refused, naming the
// first message.
func TestRepeatedTransactionIDMustMatch(t *testing.T) {
	s := openStore(t)
	first, dup := putHalf(t, s, half("h1", "shop", "order-1"))
	require.False(t, dup)
	require.Equal(t, contentHash([]byte("body of h1")), first.ContentHash)

	retry := half("h2", "shop", "order-1")
	retry.Body = []byte("body of h1")
	retry.Properties = map[string]string{"traceparent": "rebuilt by the retry"}
	retry.Key = "another key"
	got, dup := putHalf(t, s, retry)
	require.True(t, dup, "same topic and body: a retry, whatever its properties")
	require.Equal(t, "h1", got.Id)

	other := half("h3", "shop", "order-1")
	err := putHalfErr(t, s, other)
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorContains(t, err, `transaction ID "order-1" of producer group shop is message h1, sent with another body`)
	moved := half("h4", "shop", "order-1")
	moved.Topic, moved.Body = "audit", []byte("body of h1")
	require.ErrorContains(t, putHalfErr(t, s, moved), "is message h1, sent with topic orders, not audit")

	resolve(t, s, "h1", Commit, byProducer, t0+sec)
	require.Empty(t, getHalf(t, s, "h1").Body, "the body is dropped on commit")
	_, dup = putHalf(t, s, retry)
	require.True(t, dup, "the hash outlives the body")
	require.ErrorIs(t, putHalfErr(t, s, other), ErrConflict)
	require.Empty(t, readTopic(t, s, "orders", 2, 10), "nothing was stored by the repeats")
}

// A Send key names one message within the dedup window: a repeat with the
// same body is a duplicate, one with another body is refused, naming the
// first message; after the window the key is free again.
func TestRepeatedSendKeyMustMatch(t *testing.T) {
	s := openStore(t)
	window := 10 * sec
	sendBody := func(id, body string, now int64) (*storepb.Message, bool, error) {
		var m *storepb.Message
		var dup bool
		var refused error
		update(t, s, func(tx *Tx) error {
			m, dup, refused = tx.Send("orders", &storepb.Message{Id: id, Key: "k", Body: []byte(body)}, true, window, now)
			return nil
		})
		return m, dup, refused
	}
	m, dup, err := sendBody("m1", "paid", t0)
	require.NoError(t, err)
	require.False(t, dup)
	require.Equal(t, uint64(1), m.Sequence)
	m, dup, err = sendBody("m2", "paid", t0+sec)
	require.NoError(t, err)
	require.True(t, dup)
	require.Equal(t, "m1", m.Id)
	_, _, err = sendBody("m3", "shipped", t0+2*sec)
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorContains(t, err, `key "k" was sent on topic orders as message m1 (sequence 1) with another body`)
	m, dup, err = sendBody("m4", "shipped", t0+window)
	require.NoError(t, err, "after the dedup window the key names a new message")
	require.False(t, dup)
	require.Equal(t, "m4", m.Id)
	require.Equal(t, []string{"m1", "m4"}, ids(readTopic(t, s, "orders", 1, 10)))
}

// A store at schema version 1 (no content hashes) gets the hashes of every
// body still at hand: pending and expired half messages', committed ones'
// and dedup keys' from the topic log; a rolled-back half message and a key
// whose message retention dropped keep none, and are not compared by body.
func TestVersion1StoreGetsContentHashes(t *testing.T) {
	s := openStore(t)
	send(t, s, "orders", "gone", "k-gone", 0, t0)
	for _, id := range []string{"p", "e", "c", "r"} {
		putHalf(t, s, half(id, "shop", "tx-"+id))
	}
	update(t, s, func(tx *Tx) error {
		if _, _, err := tx.Expire("e", t0+sec, false); err != nil {
			return err
		}
		if _, _, err := tx.Resolve("c", Commit, byProducer, t0+sec); err != nil {
			return err
		}
		_, _, err := tx.Resolve("r", Rollback, byProducer, t0+sec)
		return err
	})
	send(t, s, "orders", "kept", "k-kept", 0, t0+3*sec)
	update(t, s, func(tx *Tx) error { _, err := tx.Trim("orders", 1, 10); return err })
	require.Equal(t, []string{"c", "kept"}, ids(readTopic(t, s, "orders", 1, 10)))

	require.NoError(t, s.Close())
	writeBolt(t, s.Path(), func(btx *bolt.Tx) error {
		if err := stripHashes(btx); err != nil {
			return err
		}
		return setVersion(btx, 1)
	})
	s = openAt(t, s.Path())
	require.Equal(t, SchemaVersion, schemaVersion(t, s))
	for _, id := range []string{"p", "e", "c"} {
		require.Equal(t, contentHash([]byte("body of "+id)), getHalf(t, s, id).ContentHash, id)
	}
	require.Empty(t, getHalf(t, s, "r").ContentHash, "a rolled-back message has no body left to hash")
	require.Equal(t, contentHash([]byte("body of kept")), dedupRecord(t, s, "orders\x00k-kept").ContentHash)
	require.Empty(t, dedupRecord(t, s, "orders\x00k-gone").ContentHash, "the trimmed message's key keeps no hash")
}

func dedupRecord(t *testing.T, s *Store, key string) *storepb.Dedup {
	t.Helper()
	d := &storepb.Dedup{}
	view(t, s, func(tx *Tx) error {
		found, err := get(tx.tx.Bucket(bktDedup), []byte(key), d)
		require.True(t, found, key)
		return err
	})
	return d
}

// stripHashes clears the content hash of every half message and dedup
// record, as version 1 wrote them.
func stripHashes(btx *bolt.Tx) error {
	halves, dedup := btx.Bucket(bktHalf), btx.Bucket(bktDedup)
	var hs []*storepb.Half
	err := halves.ForEach(func(k, _ []byte) error {
		h := &storepb.Half{}
		_, err := get(halves, k, h)
		hs = append(hs, h)
		return err
	})
	if err != nil {
		return err
	}
	for _, h := range hs {
		h.ContentHash = nil
		if err := put(halves, []byte(h.Id), h); err != nil {
			return err
		}
	}
	ds := map[string]*storepb.Dedup{}
	err = dedup.ForEach(func(k, _ []byte) error {
		d := &storepb.Dedup{}
		_, err := get(dedup, k, d)
		ds[string(k)] = d
		return err
	})
	if err != nil {
		return err
	}
	for k, d := range ds {
		d.ContentHash = nil
		if err := put(dedup, []byte(k), d); err != nil {
			return err
		}
	}
	return nil
}

// A half message without a hash (rolled back before schema version 2) is
// compared by topic only: its body is gone, so a repeat with any body is
// the duplicate it always was, and one on another topic is refused.
func TestRepeatOfUnhashedHalfComparesTopic(t *testing.T) {
	s := openStore(t)
	putHalf(t, s, half("h1", "shop", "order-1"))
	resolve(t, s, "h1", Rollback, byProducer, t0+sec)
	require.NoError(t, s.Close())
	writeBolt(t, s.Path(), func(btx *bolt.Tx) error {
		if err := stripHashes(btx); err != nil {
			return err
		}
		return setVersion(btx, 1)
	})
	s = openAt(t, s.Path())
	require.Empty(t, getHalf(t, s, "h1").ContentHash)

	other := half("h2", "shop", "order-1")
	got, dup := putHalf(t, s, other)
	require.True(t, dup)
	require.Equal(t, "h1", got.Id)
	other.Topic = "audit"
	require.ErrorContains(t, putHalfErr(t, s, other), "is message h1, sent with topic orders, not audit")
}
