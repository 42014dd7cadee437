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
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
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
)

// Store is the bbolt database of one node. Readers and the single writer (the
// FSM) share it; Restore swaps the file underneath, so every access goes
// through View or Update.
type Store struct {
	path string

	mu sync.RWMutex
	db *bolt.DB
}

// Open opens (or creates) the store at path and makes sure every root bucket
// exists.
func Open(path string) (*Store, error) {
	db, err := openDB(path)
	if err != nil {
		return nil, err
	}
	return &Store{path: path, db: db}, nil
}

func openDB(path string) (*bolt.DB, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: 5 * time.Second,
		// The freelist is rebuilt on open instead of written on every
		// commit: fewer pages per fsync, the way etcd runs bbolt.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		return nil, fmt.Errorf("halfstore: open %s: %w", path, err)
	}
	if err := db.Update(createRoots); err != nil {
		db.Close()
		return nil, fmt.Errorf("halfstore: init %s: %w", path, err)
	}
	return db, nil
}

// Path is the file the store lives in.
func (s *Store) Path() string { return s.path }

// Close closes the database. Later calls fail with ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.db == nil {
		return nil
	}
	err := s.db.Close()
	s.db = nil
	return err
}

// Update runs fn in one read-write transaction, committed (and fsynced) when
// fn returns nil. Only the FSM writes.
func (s *Store) Update(fn func(*Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	return s.db.Update(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
}

// View runs fn in a consistent read-only transaction.
func (s *Store) View(fn func(*Tx) error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.db == nil {
		return ErrClosed
	}
	return s.db.View(func(btx *bolt.Tx) error { return fn(&Tx{tx: btx}) })
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

// WriteTo streams the database file as of the snapshot.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) { return sn.tx.WriteTo(w) }

// Release ends the snapshot's read transaction.
func (sn *Snapshot) Release() {
	sn.once.Do(func() {
		_ = sn.tx.Rollback()
		sn.s.mu.RUnlock()
	})
}

// Restore replaces the whole store with the database file read from r: it is
// written to a temporary file beside the store, fsynced, checked, and renamed
// over the store, which is then reopened.
func (s *Store) Restore(r io.Reader) error {
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, filepath.Base(s.path)+".restore-*")
	if err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	tmpPath := tmp.Name()
	defer os.Remove(tmpPath)
	if _, err := io.Copy(tmp, r); err != nil {
		tmp.Close()
		return fmt.Errorf("halfstore: restore: copy: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("halfstore: restore: fsync: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	// Refuse a file bbolt cannot open before the current store is touched.
	check, err := openDB(tmpPath)
	if err != nil {
		return fmt.Errorf("halfstore: restore: snapshot is not a store: %w", err)
	}
	if err := check.Close(); err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}

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
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("halfstore: restore: %w", err)
	}
	db, err := openDB(s.path)
	if err != nil {
		return err
	}
	s.db = db
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
