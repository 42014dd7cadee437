package halfstore

import (
	"bytes"
	"errors"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/internal/diskio"
)

// What the writer applied is visible to every read before it is committed:
// a read commits it first.
func TestWriterReadsSeeEverythingApplied(t *testing.T) {
	s := openStore(t)
	w := s.Writer()
	require.Same(t, w, s.Writer(), "one writer per store")
	require.NoError(t, w.Apply(func(tx *Tx) error {
		_, _, err := tx.PutHalf(half("h1", "shop", "tx1"), true)
		return err
	}))
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(7) }))
	require.Zero(t, w.Commits(), "nothing committed yet")
	view(t, s, func(tx *Tx) error {
		_, err := tx.Half("h1")
		require.NoError(t, err)
		require.Equal(t, uint64(7), tx.AppliedIndex())
		return nil
	})
	require.Equal(t, uint64(1), w.Commits(), "the read committed the open transaction")
	did, err := w.Commit()
	require.NoError(t, err)
	require.False(t, did, "nothing left to commit")

	// A snapshot includes what is applied and not committed yet.
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(8) }))
	sn, err := s.Snapshot()
	require.NoError(t, err)
	require.Equal(t, uint64(8), sn.AppliedIndex())
	sn.Release()

	// Close commits what is open.
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(9) }))
	s = reopen(t, s)
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(9), idx)
}

// Read sees what was applied without committing it, and reads a store
// with no open transaction as View does; a failed writer refuses it.
func TestWriterReadSeesOpenTransactionWithoutCommitting(t *testing.T) {
	s := openStore(t)
	w := s.Writer()
	require.NoError(t, w.Read(func(tx *Tx) error {
		require.Zero(t, tx.AppliedIndex(), "an empty store, no transaction open")
		return nil
	}))
	require.NoError(t, w.Apply(func(tx *Tx) error {
		_, _, err := tx.PutHalf(half("h1", "shop", "tx1"), true)
		return err
	}))
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(5) }))
	require.NoError(t, w.Read(func(tx *Tx) error {
		_, err := tx.Half("h1")
		require.NoError(t, err)
		require.Equal(t, uint64(5), tx.AppliedIndex())
		return nil
	}))
	require.Zero(t, w.Commits(), "Read committed nothing")

	did, err := w.Commit()
	require.NoError(t, err)
	require.True(t, did)
	require.NoError(t, w.Read(func(tx *Tx) error {
		require.Equal(t, uint64(5), tx.AppliedIndex(), "after the commit, from a read transaction")
		return nil
	}))

	boom := errors.New("boom")
	require.ErrorIs(t, w.Apply(func(*Tx) error { return boom }), boom)
	require.ErrorIs(t, w.Read(func(*Tx) error { return nil }), boom, "a failed writer refuses reads")
}

// Only committed transactions reach the file: a process that dies with a
// transaction open leaves the store as of its last commit, which the log
// replays from.
func TestWriterOpenTransactionIsNotOnDisk(t *testing.T) {
	s := openStore(t)
	w := s.Writer()
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(3) }))
	_, err := w.Commit()
	require.NoError(t, err)
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(4) }))

	// What a kill -9 now leaves: the file as it is.
	raw, err := os.ReadFile(s.Path())
	require.NoError(t, err)
	crashed := t.TempDir() + "/crashed.db"
	require.NoError(t, os.WriteFile(crashed, raw, 0o600))
	c := openAt(t, crashed)
	idx, err := c.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(3), idx, "the open transaction is not in the file")
}

// A failing apply rolls back what the open transaction held and fails the
// writer for good: nothing applied after it can land on a store that lost
// entries.
func TestWriterFailureIsFinal(t *testing.T) {
	s := openStore(t)
	w := s.Writer()
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(5) }))
	boom := errors.New("disk on fire")
	require.ErrorIs(t, w.Apply(func(tx *Tx) error { return boom }), boom)
	err := w.Apply(func(tx *Tx) error { return nil })
	require.ErrorIs(t, err, boom, "the writer stays failed")
	require.ErrorIs(t, s.View(func(*Tx) error { return nil }), boom, "reads say so too")
	_, err = w.Commit()
	require.ErrorIs(t, err, boom)
}

// Restoring a snapshot drops what the writer applied and did not commit:
// the snapshot supersedes it.
func TestWriterRestoreDiscardsOpenTransaction(t *testing.T) {
	src := openStore(t)
	update(t, src, func(tx *Tx) error { return tx.SetAppliedIndex(100) })
	sn, err := src.Snapshot()
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = sn.WriteTo(&buf)
	sn.Release()
	require.NoError(t, err)

	s := openStore(t)
	w := s.Writer()
	require.NoError(t, w.Apply(func(tx *Tx) error {
		_, _, err := tx.PutHalf(half("h1", "shop", "tx1"), true)
		return err
	}))
	require.NoError(t, s.Restore(&buf))
	view(t, s, func(tx *Tx) error {
		require.Equal(t, uint64(100), tx.AppliedIndex())
		_, err := tx.Half("h1")
		require.ErrorIs(t, err, ErrNotFound, "the discarded write is gone")
		return nil
	})
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(101) }), "the writer goes on after a restore")
}

// A failed writer marks an unsynced store for a rebuild when it closes:
// the file may hold writes the kernel could not make.
func TestWriterFailureTaintsTheStore(t *testing.T) {
	setBootID(t, "boot-1")
	path := t.TempDir() + "/fsm.db"
	s, _, err := OpenUnsynced(path, "")
	require.NoError(t, err)
	w := s.Writer()
	require.Error(t, w.Apply(func(tx *Tx) error {
		return tx.tx.Bucket(bktMeta).Put(make([]byte, bolt.MaxKeySize+1), present)
	}))
	require.Error(t, s.Close())
	s, how, err := OpenUnsynced(path, "")
	require.NoError(t, err)
	require.True(t, how.Discarded, "the store is rebuilt")
	require.NoError(t, s.Close())
}

// A commit the disk refuses (full) fails the writer until Retry applies
// again what was lost and commits it: nothing reads the store behind what
// was applied meanwhile, and the store has it all once the disk has room.
func TestWriterRetryAfterFailedCommit(t *testing.T) {
	s := openStore(t)
	w := s.Writer()
	apply := func(tx *Tx) error {
		if _, _, err := tx.PutHalf(half("h1", "shop", "tx1"), true); err != nil {
			return err
		}
		return tx.SetAppliedIndex(5)
	}
	require.NoError(t, w.Apply(apply))
	full := func() error { return &os.PathError{Op: "write", Path: s.Path(), Err: syscall.ENOSPC} }
	w.InjectFault(full)
	_, err := w.Commit()
	require.ErrorIs(t, err, diskio.ErrWrite)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.ErrorIs(t, s.View(func(*Tx) error { return nil }), diskio.ErrWrite, "no read behind what was applied")
	require.ErrorIs(t, w.Apply(func(*Tx) error { return nil }), diskio.ErrWrite)

	require.ErrorIs(t, w.Retry(apply), syscall.ENOSPC, "still full")
	w.InjectFault(nil)
	require.NoError(t, w.Retry(apply))
	view(t, s, func(tx *Tx) error {
		require.Equal(t, uint64(5), tx.AppliedIndex())
		_, err := tx.Half("h1")
		return err
	})
	require.NoError(t, w.Apply(func(tx *Tx) error { return tx.SetAppliedIndex(6) }), "the writer works again")
	s = reopen(t, s)
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, uint64(6), idx)
}
