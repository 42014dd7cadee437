// Package halfstore owns every bucket txmq keeps in bbolt: half messages and
// their indexes, committed topic logs, consumer group progress, Send dedup
// keys, and the last applied Raft index.
//
// It is pure storage. It knows nothing of Raft, gRPC or the clock: times are
// passed in by the caller (the Raft FSM, which gets them from the leader), so
// that applying the same commands gives the same bytes on every node. Each
// transition of the half message lifecycle is one method of Tx that checks its
// preconditions before it writes anything.
package halfstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/internal/diskio"
)

// Sentinel errors. Callers test them with errors.Is; the wrapped message
// names the object and its state so that a person can act on it.
var (
	ErrNotFound = errors.New("not found")
	// ErrConflict: the message was already resolved the other way (first
	// resolution wins).
	ErrConflict = errors.New("conflict")
	// ErrExpired: the message expired; only an operator may resolve it now.
	ErrExpired = errors.New("expired")
	// ErrInvalid: a request that storage must refuse (missing field,
	// sequence beyond the end of a topic).
	ErrInvalid = errors.New("invalid")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("halfstore: closed")
	// ErrNewerSchema: the store's schema version is newer than this code
	// knows (see SchemaVersion); it is refused, never opened.
	ErrNewerSchema = errors.New("written by a newer txmq")
)

// Store is the bbolt database of one node. Readers and the single writer (the
// FSM) share it; Restore swaps the file underneath, so every access goes
// through View or Update.
type Store struct {
	path string
	// unsynced: commits are not fsynced, and the marker file (markerPath)
	// exists while the store is open (see OpenUnsynced).
	unsynced bool

	mu sync.RWMutex
	db *bolt.DB
	// writer, once made, holds applied writes until it commits them.
	writer atomic.Pointer[Writer]
}

// Open opens (or creates) the store at path, migrating it to SchemaVersion
// if it is older and refusing it (ErrNewerSchema) if it is newer. Every
// commit is fsynced.
func Open(path string) (*Store, error) {
	db, err := openDB(path, false)
	if err != nil {
		return nil, err
	}
	return &Store{path: path, db: db}, nil
}

func openDB(path string, noSync bool) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		NoSync:  noSync,
		Timeout: 5 * time.Second,
		// The freelist is rebuilt on open instead of written on every
		// commit: fewer pages per fsync, the way etcd runs bbolt.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// A read transaction (a snapshot being streamed) holds the mmap;
		// a write that must grow it waits for the reader. Mapping 1 GiB up
		// front (address space, not memory) keeps writes going during a
		// snapshot until the store outgrows it.
		InitialMmapSize: 1 << 30,
	})
	if err != nil {
		return nil, fmt.Errorf("halfstore: open %s: %w", path, err)
	}
	if err := migrate(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("halfstore: open %s: %w", path, err)
	}
	return db, nil
}

// Path is the file the store lives in.
func (s *Store) Path() string { return s.path }

// Close closes the database. Later calls fail with ErrClosed. An unsynced
// store is fsynced first, and its marker removed: it is then whole on disk.
func (s *Store) Close() error {
	settled := s.settle()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	if !s.unsynced {
		err := s.db.Close()
		s.db = nil
		return errors.Join(settled, err)
	}
	err := s.syncLocked()
	err = errors.Join(err, s.db.Close())
	s.db = nil
	if settled != nil {
		// A commit failed: the file may hold what the kernel could not
		// write; rebuild it on the next open.
		return errors.Join(settled, err, s.writeMarker([]byte(taintedMarker)))
	}
	if err != nil {
		return err
	}
	return s.removeMarker()
}

// Update runs fn in one read-write transaction, committed when fn returns
// nil (and fsynced, unless the store was opened with OpenUnsynced), after
// the writer's open transaction is committed.
func (s *Store) Update(fn func(*Tx) error) error { return s.run((*bolt.DB).Update, fn) }

// View runs fn in a consistent read-only transaction that sees everything
// the writer applied (its open transaction is committed first).
func (s *Store) View(fn func(*Tx) error) error { return s.run((*bolt.DB).View, fn) }

// run settles the writer, then runs fn in a transaction of bbolt's kind
// (Update or View).
func (s *Store) run(kind func(*bolt.DB, func(*bolt.Tx) error) error, fn func(*Tx) error) error {
	if err := s.settle(); err != nil {
		return err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	return kind(s.db, func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// AppliedIndex is the last Raft index whose effects are in the store.
func (s *Store) AppliedIndex() (uint64, error) {
	var idx uint64
	err := s.View(func(tx *Tx) error {
		idx = tx.AppliedIndex()
		return nil
	})
	return idx, err
}

// Stats describes the database file.
type Stats struct {
	FileSize  int64
	FreePages int
}

// Stats reads the size of the file and its free pages.
func (s *Store) Stats() (Stats, error) {
	var st Stats
	err := s.View(func(tx *Tx) error {
		st.FileSize = tx.tx.Size()
		return nil
	})
	if err != nil {
		return st, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db != nil {
		st.FreePages = s.db.Stats().FreePageN
	}
	return st, nil
}

// Snapshot is a consistent point-in-time view of the whole store that can be
// streamed out while the FSM keeps writing.
type Snapshot struct {
	s    *Store
	tx   *bolt.Tx
	once sync.Once
}

// Snapshot starts a read transaction. The caller must Release it; until then
// Restore waits.
func (s *Store) Snapshot() (*Snapshot, error) {
	if err := s.settle(); err != nil {
		return nil, err
	}
	s.mu.RLock()
	if s.db == nil {
		s.mu.RUnlock()
		return nil, ErrClosed
	}
	tx, err := s.db.Begin(false)
	if err != nil {
		s.mu.RUnlock()
		return nil, fmt.Errorf("halfstore: snapshot: %w", err)
	}
	return &Snapshot{s: s, tx: tx}, nil
}

// AppliedIndex is the Raft index the snapshot contains.
func (sn *Snapshot) AppliedIndex() uint64 { return (&Tx{tx: sn.tx}).AppliedIndex() }

// The snapshot stream is framed so that Restore can refuse an empty,
// truncated or damaged one before it touches the store:
//
//	"TXMQSNP1" | image length, uint64 big-endian | bbolt image | SHA-256 of the image
var snapMagic = []byte("TXMQSNP1")

const snapHeaderLen = 16

// WriteTo streams the database as of the snapshot, framed.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	size := sn.tx.Size()
	hdr := make([]byte, snapHeaderLen)
	copy(hdr, snapMagic)
	binary.BigEndian.PutUint64(hdr[8:], uint64(size))
	if _, err := w.Write(hdr); err != nil {
		return 0, err
	}
	sum := sha256.New()
	n, err := sn.tx.WriteTo(io.MultiWriter(w, sum))
	if err != nil {
		return snapHeaderLen + n, err
	}
	if n != size {
		return snapHeaderLen + n, fmt.Errorf("halfstore: snapshot wrote %d bytes, expected %d", n, size)
	}
	m, err := w.Write(sum.Sum(nil))
	return snapHeaderLen + n + int64(m), err
}

// Release ends the snapshot's read transaction.
func (sn *Snapshot) Release() {
	sn.once.Do(func() {
		_ = sn.tx.Rollback()
		sn.s.mu.RUnlock()
	})
}

// Restore replaces the whole store with a snapshot stream (as written by
// Snapshot.WriteTo) read from r: the image is written to a temporary file
// beside the store, its length and checksum verified, fsynced, opened once
// as a check (which migrates a snapshot of an older schema version, and
// refuses a newer one), and renamed over the store, which is then reopened.
// A bad stream leaves the store as it was.
func (s *Store) Restore(r io.Reader) error {
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(s.path)+".restore-*")
	if err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	tmpPath := tmp.Name()
	defer os.Remove(tmpPath)
	if err := readSnapshot(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("halfstore: restore: fsync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	// Refuse a file bbolt cannot open, or a newer schema, before the
	// current store is touched.
	check, err := openDB(tmpPath, false)
	if err != nil {
		return fmt.Errorf("halfstore: restore: the snapshot cannot be opened as a store: %w", err)
	}
	if err := check.Close(); err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}

	// What the writer applied and has not committed is superseded.
	s.writer.Load().discard()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return ErrClosed
	}
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("halfstore: restore: close: %w", err)
	}
	s.db = nil
	if err := os.Rename(tmpPath, s.path); err != nil {
		return fmt.Errorf("halfstore: restore: rename: %w", err)
	}
	if err := diskio.SyncDir(dir); err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	db, err := openDB(s.path, s.unsynced)
	if err != nil {
		return err
	}
	s.db = db
	return nil
}

// readSnapshot copies the image of a framed snapshot stream to w, checking
// its header, length and checksum.
func readSnapshot(w io.Writer, r io.Reader) error {
	hdr := make([]byte, snapHeaderLen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return fmt.Errorf("snapshot is empty or cut short in its header: %w", err)
	}
	if !bytes.Equal(hdr[:8], snapMagic) {
		return errors.New("not a txmq snapshot (bad magic)")
	}
	size := int64(binary.BigEndian.Uint64(hdr[8:]))
	sum := sha256.New()
	if n, err := io.CopyN(io.MultiWriter(w, sum), r, size); err != nil {
		return fmt.Errorf("snapshot cut short: %d of %d bytes: %w", n, size, err)
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(r, want); err != nil {
		return fmt.Errorf("snapshot cut short in its checksum: %w", err)
	}
	if !bytes.Equal(want, sum.Sum(nil)) {
		return errors.New("snapshot checksum mismatch: the snapshot is damaged")
	}
	return nil
}
