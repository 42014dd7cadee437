package halfstore

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/txmq/txmq/internal/diskio"
)

// An unsynced store does not fsync its commits. That is safe only for a
// store that can be rebuilt from elsewhere (the node's Raft snapshots and
// log), and only if a store that may be torn is never opened:
//
//   - A process crash (kill -9, panic, OOM) loses nothing: every write
//     bbolt made is in the kernel's page cache, which outlives the process,
//     and bbolt's copy-on-write commit leaves the file consistent at every
//     write() boundary as seen through that cache.
//   - A power cut or an OS crash loses the page cache. What reached the disk
//     is then any subset of the writes since the last fsync, which can tear
//     bbolt's tree (a meta page naming pages that never arrived).
//
// The two are told apart by the kernel's boot ID, which changes at every
// boot. Before the first unsynced commit, the boot ID is written to a marker
// file beside the store and fsynced; a clean Close fsyncs the store and
// removes the marker. OpenUnsynced finding a marker of another boot (or one
// it cannot read) deletes the store instead of opening it.

// bootIDPath is where Linux publishes the boot ID; tests point it elsewhere.
var bootIDPath = "/proc/sys/kernel/random/boot_id"

// taintedMarker never equals a boot ID: a store whose fsync failed is
// rebuilt on its next open, even within the same boot.
const taintedMarker = "tainted: an fsync of the store failed"

// UnsyncedOpen says what OpenUnsynced found.
type UnsyncedOpen struct {
	// Discarded: the store was left unsynced by another boot of the machine
	// (a power cut or an OS crash may have torn it), or its last fsync
	// failed, so it was deleted and starts empty.
	Discarded bool
	// Synced: the boot ID cannot be read on this system, so commits are
	// fsynced as with Open.
	Synced bool
	// Truncated: the file was shorter than its newest meta page says (cut
	// short: a bad copy, a full disk), so it was deleted and starts empty;
	// bbolt would have died of SIGBUS opening it.
	Truncated bool
}

// OpenUnsynced opens (or creates) the store at path without an fsync per
// commit, for a writer that can rebuild everything the store holds (see the
// comment above). A store that may be torn is deleted, never opened. It
// migrates an older store and refuses a newer one, as Open does.
//
// bootIDFile is where the boot ID is read; "" is the kernel's. Only tests
// set it: the fault suite's power cut presents a new boot to the brokers
// it restarts.
func OpenUnsynced(path, bootIDFile string) (*Store, UnsyncedOpen, error) {
	var how UnsyncedOpen
	boot, err := os.ReadFile(cmp.Or(bootIDFile, bootIDPath))
	if err != nil || len(bytes.TrimSpace(boot)) == 0 {
		how.Synced = true
		s, err := Open(path)
		return s, how, err
	}
	boot = bytes.TrimSpace(boot)
	s := &Store{path: path, unsynced: true}
	marker, err := os.ReadFile(s.markerPath())
	how.Truncated = truncatedStore(path)
	switch {
	case how.Truncated:
	case errors.Is(err, fs.ErrNotExist):
	case err == nil && bytes.Equal(bytes.TrimSpace(marker), boot):
	default:
		how.Discarded = true
	}
	if how.Discarded || how.Truncated {
		// Another boot, a marker torn while it was written, a failed
		// fsync, or a file shorter than its meta page says (cut short):
		// the store's file cannot be trusted.
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, how, fmt.Errorf("halfstore: discard unsynced store %s: %w", path, err)
		}
	}
	if err := s.writeMarker(boot); err != nil {
		return nil, how, err
	}
	if s.db, err = openDB(path, true); err != nil {
		return nil, how, err
	}
	return s, how, nil
}

// Sync fsyncs the store. For an unsynced store it is what makes its
// commits durable; for a synced one it does nothing. If it fails, the store
// is marked so that its next open discards it, since the kernel may drop
// the pages it could not write.
func (s *Store) Sync() error {
	if !s.unsynced {
		return nil
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	return s.syncLocked()
}

func (s *Store) syncLocked() error {
	if err := s.db.Sync(); err != nil {
		return errors.Join(fmt.Errorf("halfstore: fsync %s: %w", s.path, err), s.writeMarker([]byte(taintedMarker)))
	}
	return nil
}

func (s *Store) markerPath() string { return s.path + ".unsynced" }

// writeMarker replaces the marker with content, durably: written to a
// temporary file, fsynced, renamed, and the directory fsynced.
func (s *Store) writeMarker(content []byte) error {
	tmp := s.markerPath() + ".tmp"
	err := func() error {
		f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if _, err := f.Write(append(content, '\n')); err != nil {
			f.Close()
			return err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Rename(tmp, s.markerPath()); err != nil {
			return err
		}
		return diskio.SyncDir(filepath.Dir(s.path))
	}()
	if err != nil {
		return fmt.Errorf("halfstore: write %s: %w", s.markerPath(), err)
	}
	return nil
}

func (s *Store) removeMarker() error {
	if err := os.Remove(s.markerPath()); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("halfstore: remove %s: %w", s.markerPath(), err)
	}
	if err := diskio.SyncDir(filepath.Dir(s.path)); err != nil {
		return fmt.Errorf("halfstore: %w", err)
	}
	return nil
}
