package raftlog

import (
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/internal/diskio"
)

// errStoreClosed: the log store was closed.
var errStoreClosed = errors.New("raftlog: log store closed")

// logBackend is a log store with its stable store: the wal (wal.go) or
// raft-boltdb.
type logBackend interface {
	raft.LogStore
	raft.StableStore
	Close() error
}

// logStore guards the log store against use after Close. hashicorp/raft
// answers heartbeats on the transport's goroutines, outside the ones
// Shutdown waits for; one that started just before Shutdown can write the
// current term after it, and raft panics on any stable store error. Once
// the node is closing, such late writes are dropped: the node has stopped,
// and a heartbeat carries no entries whose durability anyone relies on.
type logStore struct {
	mu     sync.RWMutex
	closed bool
	db     logBackend
	// stored hears how long each write of entries took (Hooks.LogStored).
	stored func(entries int, d time.Duration)
	// stop ends the retries of a stable store write (the node is closing).
	stop   <-chan struct{}
	logger *slog.Logger
}

var (
	_ raft.LogStore          = (*logStore)(nil)
	_ raft.MonotonicLogStore = (*logStore)(nil)
	_ raft.StableStore       = (*logStore)(nil)
)

// IsMonotonic is the backend's: the wal's appends are contiguous, so Raft
// empties it after installing a snapshot.
func (s *logStore) IsMonotonic() bool {
	m, ok := s.db.(raft.MonotonicLogStore)
	return ok && m.IsMonotonic()
}

func (s *logStore) do(f func() error) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return errStoreClosed
	}
	return f()
}

func (s *logStore) FirstIndex() (idx uint64, err error) {
	err = s.do(func() error { idx, err = s.db.FirstIndex(); return err })
	return idx, err
}

func (s *logStore) LastIndex() (idx uint64, err error) {
	err = s.do(func() error { idx, err = s.db.LastIndex(); return err })
	return idx, err
}

func (s *logStore) GetLog(index uint64, log *raft.Log) error {
	return s.do(func() error { return s.db.GetLog(index, log) })
}

func (s *logStore) StoreLog(log *raft.Log) error {
	return s.StoreLogs([]*raft.Log{log})
}

func (s *logStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	err := s.do(func() error { return s.db.StoreLogs(logs) })
	if err == nil && s.stored != nil {
		s.stored(len(logs), time.Since(start))
	}
	return err
}

func (s *logStore) DeleteRange(min, max uint64) error {
	return s.do(func() error { return s.db.DeleteRange(min, max) })
}

func (s *logStore) Get(key []byte) (v []byte, err error) {
	err = s.do(func() error { v, err = s.db.Get(key); return err })
	return v, err
}

func (s *logStore) GetUint64(key []byte) (v uint64, err error) {
	err = s.do(func() error { v, err = s.db.GetUint64(key); return err })
	return v, err
}

// Set and SetUint64 drop writes after Close instead of failing (see the
// type's comment), and retry a write the disk refused (see setStable).
func (s *logStore) Set(key, val []byte) error {
	return s.setStable(key, func() error { return s.db.Set(key, val) })
}

func (s *logStore) SetUint64(key []byte, val uint64) error {
	return s.setStable(key, func() error { return s.db.SetUint64(key, val) })
}

// setStable writes to the stable store. hashicorp/raft panics when it
// cannot store a new term, so a write the disk refuses (full) is retried
// with backoff until it works: Raft's loop waits, the node takes part in
// nothing meanwhile, and goes on when the disk has room. Only a node that
// closes meanwhile gives up and returns the error.
func (s *logStore) setStable(key []byte, set func() error) error {
	wait := minCommitRetry
	for tries := 1; ; tries++ {
		err := s.do(set)
		switch {
		case errors.Is(err, errStoreClosed):
			return nil
		case err == nil:
			if tries > 1 {
				s.logger.Info("the Raft stable store takes writes again", "key", string(key), "tries", tries)
			}
			return nil
		case !errors.Is(err, diskio.ErrWrite):
			return err
		case tries == 1:
			s.logger.Error("cannot write the Raft stable store; this node waits until it can", "key", string(key), "err", err)
		}
		select {
		case <-s.stop:
			return err
		case <-time.After(wait):
		}
		wait = min(2*wait, maxCommitRetry)
	}
}

// Close waits for operations in progress, then closes the store.
func (s *logStore) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.db.Close()
}
