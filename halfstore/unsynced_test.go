package halfstore

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// setBootID makes the store see the given boot ID ("" for none readable).
func setBootID(t *testing.T, id string) {
	t.Helper()
	old := bootIDPath
	t.Cleanup(func() { bootIDPath = old })
	bootIDPath = filepath.Join(t.TempDir(), "boot_id")
	if id != "" {
		require.NoError(t, os.WriteFile(bootIDPath, []byte(id+"\n"), 0o600))
	}
}

func openUnsynced(t *testing.T, path string) (*Store, UnsyncedOpen) {
	t.Helper()
	s, how, err := OpenUnsynced(path, "")
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, how
}

// crash closes the file the way a killed process leaves it: no fsync, the
// marker still there.
func crash(t *testing.T, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	require.NoError(t, s.db.Close())
	s.db = nil
}

func setApplied(t *testing.T, s *Store, idx uint64) {
	t.Helper()
	update(t, s, func(tx *Tx) error { return tx.SetAppliedIndex(idx) })
}

func applied(t *testing.T, s *Store) uint64 {
	t.Helper()
	idx, err := s.AppliedIndex()
	require.NoError(t, err)
	return idx
}

// A process crash keeps the page cache, so the store is kept.
func TestUnsyncedCrashSameBootKeepsStore(t *testing.T) {
	setBootID(t, "boot-a")
	path := filepath.Join(t.TempDir(), "fsm.db")
	s, how := openUnsynced(t, path)
	require.Equal(t, UnsyncedOpen{}, how)
	setApplied(t, s, 42)
	marker, err := os.ReadFile(path + ".unsynced")
	require.NoError(t, err)
	require.Equal(t, "boot-a\n", string(marker))
	crash(t, s)

	s, how = openUnsynced(t, path)
	require.False(t, how.Discarded)
	require.Equal(t, uint64(42), applied(t, s))
}

// A power cut or an OS crash (a new boot) may have torn the store: it is
// discarded, never opened, and starts empty.
func TestUnsyncedCrashOtherBootDiscardsStore(t *testing.T) {
	setBootID(t, "boot-a")
	path := filepath.Join(t.TempDir(), "fsm.db")
	s, _ := openUnsynced(t, path)
	setApplied(t, s, 42)
	crash(t, s)
	// What a torn file may look like: bbolt must never be asked to open it.
	require.NoError(t, os.WriteFile(path, bytes.Repeat([]byte{0xff}, 8192), 0o600))

	setBootID(t, "boot-b")
	s, how := openUnsynced(t, path)
	require.True(t, how.Discarded)
	require.Zero(t, applied(t, s))
	setApplied(t, s, 7)
	marker, err := os.ReadFile(path + ".unsynced")
	require.NoError(t, err)
	require.Equal(t, "boot-b\n", string(marker))
}

// A clean close fsyncs the store and removes the marker: the store
// survives a reboot.
func TestUnsyncedCleanCloseSurvivesReboot(t *testing.T) {
	setBootID(t, "boot-a")
	path := filepath.Join(t.TempDir(), "fsm.db")
	s, _ := openUnsynced(t, path)
	setApplied(t, s, 42)
	require.NoError(t, s.Close())
	require.NoFileExists(t, path+".unsynced")

	setBootID(t, "boot-b")
	s, how := openUnsynced(t, path)
	require.False(t, how.Discarded)
	require.Equal(t, uint64(42), applied(t, s))
}

// A marker that is not this boot's (cut short while written, or marked
// after a failed fsync) discards the store too.
func TestUnsyncedUnknownMarkerDiscardsStore(t *testing.T) {
	for name, content := range map[string]string{"empty": "", "cut": "boot-", "tainted": taintedMarker} {
		t.Run(name, func(t *testing.T) {
			setBootID(t, "boot-a")
			path := filepath.Join(t.TempDir(), "fsm.db")
			s, _ := openUnsynced(t, path)
			setApplied(t, s, 42)
			crash(t, s)
			require.NoError(t, os.WriteFile(path+".unsynced", []byte(content), 0o600))

			s, how := openUnsynced(t, path)
			require.True(t, how.Discarded)
			require.Zero(t, applied(t, s))
		})
	}
}

// Without a boot ID the store is fsynced on every commit, as Open's.
func TestUnsyncedWithoutBootIDSyncs(t *testing.T) {
	setBootID(t, "")
	path := filepath.Join(t.TempDir(), "fsm.db")
	s, how := openUnsynced(t, path)
	require.Equal(t, UnsyncedOpen{Synced: true}, how)
	require.NoFileExists(t, path+".unsynced")
	setApplied(t, s, 42)
	crash(t, s)

	setBootID(t, "boot-b")
	s, how = openUnsynced(t, path)
	require.False(t, how.Discarded)
	require.Equal(t, uint64(42), applied(t, s))
}

// Restore keeps the store unsynced and marked.
func TestUnsyncedRestore(t *testing.T) {
	setBootID(t, "boot-a")
	src := openStore(t)
	setApplied(t, src, 42)
	sn, err := src.Snapshot()
	require.NoError(t, err)
	var buf bytes.Buffer
	_, err = sn.WriteTo(&buf)
	sn.Release()
	require.NoError(t, err)

	path := filepath.Join(t.TempDir(), "fsm.db")
	s, _ := openUnsynced(t, path)
	require.NoError(t, s.Restore(&buf))
	require.Equal(t, uint64(42), applied(t, s))
	setApplied(t, s, 43)
	require.NoError(t, s.Sync())
	require.FileExists(t, path+".unsynced")
	crash(t, s)

	setBootID(t, "boot-b")
	s, how := openUnsynced(t, path)
	require.True(t, how.Discarded, "written unsynced after the restore")
	require.Zero(t, applied(t, s))
}

// A store cut short (its file shorter than its meta page says) is
// discarded, as a torn one is, whether or not it was closed cleanly:
// bbolt would die of SIGBUS reading the missing pages.
func TestUnsyncedTruncatedStoreIsDiscarded(t *testing.T) {
	setBootID(t, "boot-a")
	path := filepath.Join(t.TempDir(), "fsm.db")
	s, _ := openUnsynced(t, path)
	setApplied(t, s, 42)
	// Enough data that the store's pages reach past 32 KiB.
	update(t, s, func(tx *Tx) error {
		for i := range 2000 {
			if err := tx.tx.Bucket(bktMeta).Put([]byte(fmt.Sprintf("k%05d", i)), bytes.Repeat([]byte("v"), 100)); err != nil {
				return err
			}
		}
		return nil
	})
	require.NoError(t, s.Close())
	require.False(t, truncatedStore(path), "an intact store is not reported")
	require.NoError(t, os.Truncate(path, 32<<10))
	require.True(t, truncatedStore(path))

	s, how := openUnsynced(t, path)
	require.True(t, how.Truncated)
	require.Zero(t, applied(t, s), "the store starts empty")
}

// The boot ID can be read from a file given to OpenUnsynced (the fault
// suite's power cut presents a new boot that way): a new ID there is a
// reboot, the same ID a process crash.
func TestUnsyncedBootIDFile(t *testing.T) {
	setBootID(t, "kernel-boot")
	dir := t.TempDir()
	path, bootFile := filepath.Join(dir, "fsm.db"), filepath.Join(dir, "boot_id")
	require.NoError(t, os.WriteFile(bootFile, []byte("boot-1\n"), 0o600))
	s, how, err := OpenUnsynced(path, bootFile)
	require.NoError(t, err)
	require.Equal(t, UnsyncedOpen{}, how)
	setApplied(t, s, 7)
	crash(t, s)

	s, how, err = OpenUnsynced(path, bootFile)
	require.NoError(t, err)
	require.False(t, how.Discarded, "same boot ID in the file: a process crash")
	require.Equal(t, uint64(7), applied(t, s))
	crash(t, s)

	require.NoError(t, os.WriteFile(bootFile, []byte("boot-2\n"), 0o600))
	s, how, err = OpenUnsynced(path, bootFile)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	require.True(t, how.Discarded, "a new boot ID in the file: a reboot")
	require.Zero(t, applied(t, s))
}
