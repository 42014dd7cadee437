package halfstore

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// Times are Unix nanoseconds chosen by the caller, as the FSM would.
const (
	t0  = int64(1_700_000_000_000_000_000)
	sec = int64(time.Second)
)

func protoEq(t testing.TB, want, got proto.Message, msgAndArgs ...any) {
	t.Helper()
	if !proto.Equal(want, got) {
		msg := ""
		if len(msgAndArgs) > 0 {
			if f, ok := msgAndArgs[0].(string); ok {
				msg = fmt.Sprintf(f, msgAndArgs[1:]...)
			}
		}
		require.Failf(t, "records differ", "want %v\n got %v\n%s", want, got, msg)
	}
}

// checkFor polls fn until it returns nil, failing the test after total.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	deadline := time.Now().Add(total)
	for {
		err := fn()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not true after %v: %v", total, err)
		}
		time.Sleep(every)
	}
}

// ---- stores ----

func openAt(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openStore(t testing.TB) *Store {
	t.Helper()
	return openAt(t, filepath.Join(t.TempDir(), "txmq.db"))
}

func reopen(t testing.TB, s *Store) *Store {
	t.Helper()
	require.NoError(t, s.Close())
	return openAt(t, s.Path())
}

func update(t testing.TB, s *Store, fn func(*Tx) error) {
	t.Helper()
	require.NoError(t, s.Update(fn))
}

func view(t testing.TB, s *Store, fn func(*Tx) error) {
	t.Helper()
	require.NoError(t, s.View(fn))
}

func half(id, group, txID string) *storepb.Half {
	return &storepb.Half{
		Id:            id,
		Topic:         "orders",
		ProducerGroup: group,
		TransactionId: txID,
		Key:           "key-" + id,
		Properties:    map[string]string{"origin": id},
		Body:          []byte("body of " + id),
		CreatedAt:     t0,
		CheckAfter:    6 * sec,
	}
}

func putHalf(t testing.TB, s *Store, h *storepb.Half) (*storepb.Half, bool) {
	t.Helper()
	var out *storepb.Half
	var dup bool
	update(t, s, func(tx *Tx) error {
		var err error
		out, dup, err = tx.PutHalf(h, true)
		return err
	})
	return out, dup
}

// resolve runs Resolve in its own Update and commits that transaction even
// when Resolve refuses: a refusal must not have written anything, which the
// callers check afterwards.
func resolve(t testing.TB, s *Store, id string, r Resolution, src storepb.Source, now int64) (*storepb.Half, error) {
	t.Helper()
	var out *storepb.Half
	var rerr error
	update(t, s, func(tx *Tx) error {
		out, _, rerr = tx.Resolve(id, r, src, now)
		return nil
	})
	return out, rerr
}

// expire is resolve for Expire.
func expire(t testing.TB, s *Store, id string, now int64) (*storepb.Half, error) {
	t.Helper()
	var out *storepb.Half
	var rerr error
	update(t, s, func(tx *Tx) error {
		out, _, rerr = tx.Expire(id, now, false)
		return nil
	})
	return out, rerr
}

func getHalf(t testing.TB, s *Store, id string) *storepb.Half {
	t.Helper()
	var h *storepb.Half
	view(t, s, func(tx *Tx) error {
		var err error
		h, err = tx.Half(id)
		return err
	})
	return h
}

// send appends a plain message; a size gives it a body of that many bytes.
func send(t testing.TB, s *Store, topic, id, key string, window, now int64, size ...int) (*storepb.Message, bool) {
	t.Helper()
	body := "body of " + id
	if len(size) > 0 {
		body = string(make([]byte, size[0]))
	}
	return sendAs(t, s, topic, id, key, body, window, now)
}

// sendAs is send with a given body, for repeats of a key.
func sendAs(t testing.TB, s *Store, topic, id, key, body string, window, now int64) (*storepb.Message, bool) {
	t.Helper()
	var m *storepb.Message
	var dup bool
	update(t, s, func(tx *Tx) error {
		var err error
		m, dup, err = tx.Send(topic, &storepb.Message{Id: id, Key: key, Body: []byte(body)}, true, window, now)
		return err
	})
	return m, dup
}

func readTopic(t testing.TB, s *Store, topic string, from uint64, limit int) []*storepb.Message {
	t.Helper()
	var ms []*storepb.Message
	view(t, s, func(tx *Tx) error {
		var err error
		ms, err = tx.ReadTopic(topic, from, limit)
		return err
	})
	return ms
}

func seqs(ms []*storepb.Message) []uint64 {
	out := []uint64{}
	for _, m := range ms {
		out = append(out, m.Sequence)
	}
	return out
}

func ids[T interface{ GetId() string }](xs []T) []string {
	out := []string{}
	for _, x := range xs {
		out = append(out, x.GetId())
	}
	return out
}

func listHalf(t testing.TB, s *Store, group string, st storepb.HalfState, after string, limit int) []*storepb.Half {
	t.Helper()
	var hs []*storepb.Half
	view(t, s, func(tx *Tx) error {
		var err error
		hs, err = tx.ListHalf(group, st, after, limit)
		return err
	})
	return hs
}

// listAll pages through ListHalf with the given page size.
func listAll(t testing.TB, s *Store, group string, st storepb.HalfState, page int) []string {
	t.Helper()
	var out []string
	after := ""
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("ListHalf pagination does not end")
		}
		hs := listHalf(t, s, group, st, after, page)
		require.True(t, len(hs) <= page, "page of %d with limit %d", len(hs), page)
		if len(hs) == 0 {
			return out
		}
		for _, h := range hs {
			out = append(out, h.Id)
		}
		after = hs[len(hs)-1].Id
	}
}

// stateIndex reads the half_state bucket: message ID -> states it is
// indexed under.
func stateIndex(t testing.TB, s *Store) map[string][]storepb.HalfState {
	t.Helper()
	out := map[string][]storepb.HalfState{}
	view(t, s, func(tx *Tx) error {
		return tx.tx.Bucket(bktHalfState).ForEach(func(k, _ []byte) error {
			out[string(k[1:])] = append(out[string(k[1:])], storepb.HalfState(k[0]))
			return nil
		})
	})
	return out
}

// dumpBolt lists every bucket, key and value of a bbolt transaction, nested
// buckets included, in key order: the logical content of the store.
func dumpBolt(t testing.TB, btx *bolt.Tx) []string {
	t.Helper()
	var out []string
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				if nb := b.Bucket(k); nb != nil {
					p := prefix + "/" + hex.EncodeToString(k)
					out = append(out, p+"/")
					return walk(p, nb)
				}
			}
			out = append(out, prefix+"/"+hex.EncodeToString(k)+"="+hex.EncodeToString(v))
			return nil
		})
	}
	err := btx.ForEach(func(name []byte, b *bolt.Bucket) error {
		p := hex.EncodeToString(name)
		out = append(out, p+"/")
		return walk(p, b)
	})
	require.NoError(t, err)
	return out
}

func dump(t testing.TB, s *Store) []string {
	t.Helper()
	var out []string
	view(t, s, func(tx *Tx) error {
		out = dumpBolt(t, tx.tx)
		return nil
	})
	return out
}

// noTempFiles checks Restore left nothing beside the store.
func noTempFiles(t testing.TB, s *Store) {
	t.Helper()
	entries, err := os.ReadDir(filepath.Dir(s.Path()))
	require.NoError(t, err)
	for _, e := range entries {
		require.True(t, e.Name() == filepath.Base(s.Path()), "unexpected file %s beside the store", e.Name())
	}
}
