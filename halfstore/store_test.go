package halfstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

// workload applies a fixed sequence of FSM-like operations, one Update per
// Raft entry, touching every bucket: half messages in every state, plain
// sends with and without dedup, consumer groups and acks, the applied index.
// from/to select a slice of the entries; entries refer only to messages of
// the same slice, so any slice applies to any store.
func workload(t testing.TB, s *Store, from, to int) {
	t.Helper()
	require.NoError(t, workloadErr(s, from, to))
}

// workloadBody is the body of entry i's half message, which its retry
// repeats.
func workloadBody(i int) []byte {
	return bytes.Repeat([]byte{byte(i)}, 50+(i*97)%400)
}

func workloadErr(s *Store, from, to int) error {
	rng := rand.New(rand.NewPCG(7, uint64(from))) // the same ops on every store
	for i := from; i < to; i++ {
		now := t0 + int64(i)*sec
		id := fmt.Sprintf("h%04d", i)
		err := s.Update(func(tx *Tx) error {
			topic := []string{"orders", "payments", "audit"}[i%3]
			h := half(id, fmt.Sprintf("pg-%d", i%4), fmt.Sprintf("tx-%d", i))
			h.Topic = topic
			h.CreatedAt = now
			h.Body = workloadBody(i)
			if _, _, err := tx.PutHalf(h, true); err != nil {
				return err
			}
			// A retry of an older transaction (the entries before from may
			// not have been applied to this store).
			if i-7 >= from {
				retry := half("retry-"+id, fmt.Sprintf("pg-%d", (i-7)%4), fmt.Sprintf("tx-%d", i-7))
				retry.Topic, retry.Body = []string{"orders", "payments", "audit"}[(i-7)%3], workloadBody(i-7)
				if _, dup, err := tx.PutHalf(retry, true); err != nil || !dup {
					return fmt.Errorf("retry: dup %v: %w", dup, err)
				}
			}
			// Resolve an older one.
			if i-5 >= from {
				old := fmt.Sprintf("h%04d", i-5)
				var err error
				switch i % 5 {
				case 0, 1:
					_, _, err = tx.Resolve(old, Commit, byProducer, now)
				case 2:
					_, _, err = tx.Resolve(old, Rollback, byCheckback, now)
				case 3:
					_, _, err = tx.Expire(old, now, false)
				}
				if err != nil {
					return err
				}
			}
			// Operators deal with some expired ones.
			if i-10 >= from && i%5 == 3 {
				if _, _, err := tx.Resolve(fmt.Sprintf("h%04d", i-10), Commit, byOperator, now); err != nil {
					return err
				}
			}
			// Plain sends, some with a repeated key.
			key := ""
			if i%2 == 0 {
				key = fmt.Sprintf("k%d", i%7)
			}
			if _, _, err := tx.Send(topic, &storepb.Message{Id: "s" + id, Key: key, Body: []byte(id)}, true, 5*sec, now); err != nil {
				return err
			}
			// Consumer groups and acks.
			if i == from+3 {
				for _, tp := range []string{"orders", "payments", "audit"} {
					if _, _, err := tx.CreateGroup(tp, "billing", GroupStart{}, now, false); err != nil {
						return err
					}
					if _, _, err := tx.CreateGroup(tp, "search", GroupStart{Latest: true}, now, false); err != nil {
						return err
					}
				}
			}
			if i > from+3 {
				tp, err := tx.Topic(topic)
				if err != nil {
					return err
				}
				var acks []uint64
				for j := 0; j < 3; j++ {
					acks = append(acks, 1+rng.Uint64N(tp.LastSequence))
				}
				if _, err := tx.Ack(topic, "billing", acks, nil); err != nil {
					return err
				}
			}
			return tx.SetAppliedIndex(uint64(i + 1))
		})
		if err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	return nil
}

func TestReopenKeepsEverything(t *testing.T) {
	s := openStore(t)
	workload(t, s, 0, 60)
	before := dump(t, s)
	half7 := getHalf(t, s, "h0007")
	require.True(t, len(before) > 100, "the workload wrote little: %d entries", len(before))

	s = reopen(t, s)
	require.Equal(t, before, dump(t, s), "the store changed across Close/Open")
	protoEq(t, half7, getHalf(t, s, "h0007"))
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(60), idx)

	// And it goes on where it stopped.
	workload(t, s, 60, 70)
	idx, err = s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(70), idx)
}

func TestClosedStore(t *testing.T) {
	s := openStore(t)
	workload(t, s, 0, 5)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close twice")

	require.ErrorIs(t, s.View(func(*Tx) error { t.Fatal("View ran on a closed store"); return nil }), ErrClosed)
	require.ErrorIs(t, s.Update(func(*Tx) error { t.Fatal("Update ran on a closed store"); return nil }), ErrClosed)
	_, err := s.AppliedIndex()
	require.ErrorIs(t, err, ErrClosed)
	_, err = s.Stats()
	require.ErrorIs(t, err, ErrClosed)
	_, err = s.Snapshot()
	require.ErrorIs(t, err, ErrClosed)

	src := openStore(t)
	workload(t, src, 0, 3)
	require.ErrorIs(t, s.Restore(bytes.NewReader(snapshotBytes(t, src))), ErrClosed)
	noTempFiles(t, s)
}

func TestStats(t *testing.T) {
	s := openStore(t)
	workload(t, s, 0, 20)
	st, err := s.Stats()
	require.NoError(t, err)
	require.True(t, st.FileSize > 0)
	fi, err := os.Stat(s.Path())
	require.NoError(t, err)
	require.True(t, st.FileSize <= fi.Size(), "Stats.FileSize %d > file %d", st.FileSize, fi.Size())
	require.True(t, st.FreePages >= 0)
}

func snapshotBytes(t testing.TB, s *Store) []byte {
	t.Helper()
	sn, err := s.Snapshot()
	require.NoError(t, err)
	defer sn.Release()
	var buf bytes.Buffer
	n, err := sn.WriteTo(&buf)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), n)
	return buf.Bytes()
}

func TestSnapshotRestore(t *testing.T) {
	src := openStore(t)
	workload(t, src, 0, 40)
	// Grow the file (and bbolt's mmap) first, so that the writes below fit
	// without a remap, which would wait for the snapshot's read transaction
	// (see TestWriteWhileSnapshotHeld).
	send(t, src, "bulk", "bulk-1", "", 0, t0, 4<<20)
	update(t, src, func(tx *Tx) error { return tx.SetAppliedIndex(40) })

	sn, err := src.Snapshot()
	require.NoError(t, err)
	require.Equal(t, uint64(40), sn.AppliedIndex())
	atSnapshot := dumpBolt(t, sn.tx)

	// The FSM keeps writing while the snapshot is held.
	done := make(chan error, 1)
	go func() {
		done <- workloadErr(src, 40, 50)
	}()
	if awaitWriter(t, done) {
		sn.Release()
		<-done
		t.Fatal("the writes after the snapshot need a remap; grow the store more first")
	}
	idx, err := src.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(50), idx)
	require.Equal(t, uint64(40), sn.AppliedIndex(), "the snapshot does not move")
	afterWrites := dump(t, src)

	var buf bytes.Buffer
	n, err := sn.WriteTo(&buf)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), n)
	sn.Release()
	sn.Release() // twice is harmless

	// A second store with content of its own is replaced by the snapshot.
	dst := openStore(t)
	workload(t, dst, 100, 110)
	require.NoError(t, dst.Restore(bytes.NewReader(buf.Bytes())))
	noTempFiles(t, dst)
	require.Equal(t, atSnapshot, dump(t, dst), "the restored store is not the snapshot")
	idx, err = dst.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(40), idx)
	view(t, dst, func(tx *Tx) error {
		_, err := tx.Half("h0045")
		require.ErrorIs(t, err, ErrNotFound, "a write after the snapshot")
		_, err = tx.Half("h0105")
		require.ErrorIs(t, err, ErrNotFound, "the store's own content before Restore")
		_, err = tx.Half("h0039")
		require.NoError(t, err)
		return nil
	})

	// The restored store is usable and, fed the same entries, ends where
	// the source did.
	workload(t, dst, 40, 50)
	require.Equal(t, afterWrites, dump(t, dst))

	// It survives a reopen.
	dst = reopen(t, dst)
	require.Equal(t, afterWrites, dump(t, dst))

	// The source is untouched by all this.
	require.Equal(t, afterWrites, dump(t, src))
}

func TestRestoreGarbage(t *testing.T) {
	s := openStore(t)
	workload(t, s, 0, 20)
	before := dump(t, s)

	rng := rand.New(rand.NewPCG(3, 4))
	random := make([]byte, 64<<10)
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	// A real snapshot with its two meta pages damaged.
	damaged := snapshotBytes(t, s)
	for i := 16; i < 64; i++ {
		damaged[i] ^= 0xff
		damaged[os.Getpagesize()+i] ^= 0xff
	}
	for name, b := range map[string][]byte{
		"short text":   []byte("this is not a bbolt file"),
		"random bytes": random,
		"zero pages":   make([]byte, 4*os.Getpagesize()),
		"bad metas":    damaged,
	} {
		err := s.Restore(bytes.NewReader(b))
		require.True(t, err != nil, "Restore(%s) accepted", name)
		require.Equal(t, before, dump(t, s), "Restore(%s) changed the store", name)
		noTempFiles(t, s)
	}

	// Still usable.
	workload(t, s, 20, 25)
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(25), idx)

	// A reader that fails half way is refused too.
	good := snapshotBytes(t, s)
	err = s.Restore(&failingReader{data: good[:len(good)/2]})
	require.True(t, errors.Is(err, errReadFailed), "got %v", err)
	idx, err = s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(25), idx)
	noTempFiles(t, s)
}

var errReadFailed = errors.New("read failed")

type failingReader struct{ data []byte }

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, errReadFailed
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestRestoreEmptyStream(t *testing.T) {
	s := openStore(t)
	workload(t, s, 0, 10)
	before := dump(t, s)
	err := s.Restore(bytes.NewReader(nil))
	require.True(t, err != nil, "Restore of an empty stream was accepted")
	require.Equal(t, before, dump(t, s))
}

// A snapshot cut short (a transfer that broke off) has intact meta pages but
// points at pages beyond the end of the file. Opening it in bbolt panics or
// faults (SIGBUS), which kills the process, so each case runs in a child.
func TestRestoreTruncatedSnapshot(t *testing.T) {
	if path := os.Getenv("HALFSTORE_TRUNCATED_SNAPSHOT"); path != "" {
		restoreTruncatedChild(t, path)
		return
	}

	src := openStore(t)
	workload(t, src, 0, 60)
	snap := snapshotBytes(t, src)
	page := os.Getpagesize()
	for _, cut := range []int{3 * page, len(snap) / 2, len(snap) - page} {
		t.Run(fmt.Sprintf("cut at %d of %d", cut, len(snap)), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "truncated")
			require.NoError(t, os.WriteFile(path, snap[:cut], 0o600))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRestoreTruncatedSnapshot$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "HALFSTORE_TRUNCATED_SNAPSHOT="+path)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "restore refused") {
				t.Fatalf("child: %v\n%s", err, firstLines(string(out), 15))
			}
		})
	}
}

func restoreTruncatedChild(t *testing.T, path string) {
	s := openStore(t)
	workload(t, s, 0, 5)
	before := dump(t, s)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	err = s.Restore(bytes.NewReader(b))
	require.True(t, err != nil, "Restore of a truncated snapshot was accepted")
	require.Equal(t, before, dump(t, s))
	t.Logf("restore refused: %v", err)
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}

func TestRestoreWaitsForSnapshot(t *testing.T) {
	src := openStore(t)
	workload(t, src, 0, 10)
	restoreFrom := snapshotBytes(t, src)

	s := openStore(t)
	workload(t, s, 100, 130)
	sn, err := s.Snapshot()
	require.NoError(t, err)
	held := dumpBolt(t, sn.tx)

	done := make(chan error, 1)
	go func() { done <- s.Restore(bytes.NewReader(restoreFrom)) }()

	// Wait until Restore is queued for the store's lock: then a reader can
	// no longer get in (sync.RWMutex lets a waiting writer go first).
	checkFor(t, 30*time.Second, time.Millisecond, func() error {
		if s.mu.TryRLock() {
			s.mu.RUnlock()
			return errors.New("Restore is not waiting for the lock yet")
		}
		return nil
	})
	select {
	case err := <-done:
		t.Fatalf("Restore returned while a snapshot was held: %v", err)
	default:
	}

	// The held snapshot still streams the old content.
	var buf bytes.Buffer
	_, err = sn.WriteTo(&buf)
	require.NoError(t, err)
	sn.Release()

	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Restore did not finish after Release")
	}
	require.Equal(t, dump(t, src), dump(t, s), "the store after Restore")

	// What the snapshot streamed is the content from before the Restore.
	other := openStore(t)
	require.NoError(t, other.Restore(&buf))
	require.Equal(t, held, dump(t, other))
}

// Two stores fed the same entries hold the same data. They do not hold the
// same bytes: with FreelistMapType, bbolt picks a free page by ranging over a
// Go map, so page numbers (and WriteTo output) differ from store to store
// once pages are reused. The logical content is what Raft needs to agree on,
// so that is what is compared.
func TestDeterministic(t *testing.T) {
	a, b := openStore(t), openStore(t)
	workload(t, a, 0, 80)
	workload(t, b, 0, 80)
	da, db := dump(t, a), dump(t, b)
	require.Equal(t, da, db, "same entries, different content")

	// Their snapshots restore to the same content too.
	ra, rb := openStore(t), openStore(t)
	sa, sb := snapshotBytes(t, a), snapshotBytes(t, b)
	require.NoError(t, ra.Restore(bytes.NewReader(sa)))
	require.NoError(t, rb.Restore(bytes.NewReader(sb)))
	require.Equal(t, da, dump(t, ra))
	require.Equal(t, da, dump(t, rb))
	t.Logf("WriteTo output byte-identical: %v (%d and %d bytes)", bytes.Equal(sa, sb), len(sa), len(sb))
}

func TestWriteWhileSnapshotHeld(t *testing.T) {
	s := openStore(t)
	workload(t, s, 0, 5)
	sn, err := s.Snapshot()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		done <- s.Update(func(tx *Tx) error {
			_, _, err := tx.Send("bulk", &storepb.Message{Id: "bulk-1", Body: make([]byte, 8<<20)}, true, 0, t0)
			return err
		})
	}()
	stalled := awaitWriter(t, done)
	var buf bytes.Buffer
	_, err = sn.WriteTo(&buf)
	require.NoError(t, err)
	sn.Release()
	if stalled {
		require.NoError(t, <-done)
		t.Fatal("the Update waited for the snapshot to be released")
	}
}

// awaitWriter waits for a writer to finish, and reports true instead if it is
// stuck in bbolt's remap behind a read transaction.
func awaitWriter(t testing.TB, done <-chan error) (stalled bool) {
	t.Helper()
	var werr error
	checkFor(t, 2*time.Minute, time.Millisecond, func() error {
		select {
		case werr = <-done:
			return nil
		default:
		}
		if remapBlocked() {
			stalled = true
			return nil
		}
		return errors.New("the writer neither finished nor blocked")
	})
	if !stalled {
		require.NoError(t, werr)
	}
	return stalled
}

// remapBlocked tells whether a goroutine waits for bbolt's mmap lock in order
// to remap.
func remapBlocked() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "go.etcd.io/bbolt.(*DB).mmap(") && strings.Contains(g, "sync.(*RWMutex).Lock(") {
			return true
		}
	}
	return false
}

// The topic log is append-only, so its pages are filled, not split in
// half: 20,000 messages of 256 bytes take about what they weigh.
func TestTopicLogPagesAreFull(t *testing.T) {
	s := openStore(t)
	body := make([]byte, 256)
	for i := 0; i < 20; i++ {
		update(t, s, func(tx *Tx) error {
			for j := 0; j < 1000; j++ {
				if _, _, err := tx.Send("t", &storepb.Message{Id: fmt.Sprintf("m%05d", i*1000+j), Body: body}, true, 0, 1); err != nil {
					return err
				}
			}
			return nil
		})
	}
	var logBytes uint64
	view(t, s, func(tx *Tx) error {
		tp, err := tx.Topic("t")
		logBytes = tp.Bytes
		return err
	})
	st, err := s.Stats()
	require.NoError(t, err)
	t.Logf("%d KiB of messages in a %d KiB file", logBytes>>10, st.FileSize>>10)
	require.Less(t, float64(st.FileSize), 1.4*float64(logBytes), "pages about half empty")
}
