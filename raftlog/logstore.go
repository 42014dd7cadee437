package raftlog

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
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
	// stop ends the retries of a stable store write and the syncs behind
	// the leader's appends (the node is closing).
	stop   <-chan struct{}
	logger *slog.Logger

	// deferred is the backend when the leader's appends are synced
	// behind them (Config.SyncLeaderAppend off), nil otherwise; raft is
	// the node's, once it exists; kick wakes syncBehind; synced hears how
	// long each of its syncs took (Hooks.LogSynced).
	deferred deferredLog
	raft     atomic.Pointer[raft.Raft]
	kick     chan struct{}
	synced   func(d time.Duration)
	// hold, when set, runs before each of syncBehind's syncs (tests).
	hold atomic.Pointer[func()]
}

// deferredLog is a log store whose appends can be made durable after they
// return (wal.Log).
type deferredLog interface {
	StoreLogsDeferred(logs []*raft.Log) error
	Sync() error
	Durable() uint64
	WaitDurable(index uint64, stop <-chan struct{}) error
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

// StoreLogs appends logs: durably before it returns, except on the
// leader with deferred syncs, where syncBehind makes them durable while
// Raft replicates them (docs/decisions.md › The leader's fsync behind its
// append). What nobody may rely on before the leader holds it durably
// waits for that: the state machine's apply (waitDurable) and the commit
// index the followers hear (commitClamp). Membership changes are synced
// at once: Raft acts on their commit inside the leader loop.
func (s *logStore) StoreLogs(logs []*raft.Log) error {
	start := time.Now()
	var err error
	if s.deferNow(logs) {
		err = s.do(func() error { return s.deferred.StoreLogsDeferred(logs) })
		if err == nil {
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
	} else {
		err = s.do(func() error { return s.db.StoreLogs(logs) })
	}
	if err == nil && s.stored != nil {
		s.stored(len(logs), time.Since(start))
	}
	return err
}

// deferNow: logs may be synced behind their append (this node leads).
func (s *logStore) deferNow(logs []*raft.Log) bool {
	if s.deferred == nil {
		return false
	}
	if r := s.raft.Load(); r == nil || r.State() != raft.Leader {
		return false
	}
	for _, l := range logs {
		if l.Type == raft.LogConfiguration {
			return false
		}
	}
	return true
}

// syncBehind makes the leader's deferred appends durable as they come,
// until stop is closed.
func (s *logStore) syncBehind() {
	for {
		select {
		case <-s.kick:
			if hold := s.hold.Load(); hold != nil {
				(*hold)()
			}
			start := time.Now()
			s.sync()
			if s.synced != nil {
				s.synced(time.Since(start))
			}
		case <-s.stop:
			return
		}
	}
}

// sync makes every append so far durable. A log that cannot be synced
// after Raft was told it holds the entries is a node that cannot go on
// (an fsync that failed may have dropped the pages it was to write): it
// stops, and a restart reads what the disk kept, which nobody relied on.
func (s *logStore) sync() {
	if s.deferred == nil {
		return
	}
	err := s.do(s.deferred.Sync)
	if err != nil && !errors.Is(err, errStoreClosed) {
		s.logger.Error("cannot sync the Raft log after appending to it", "err", err)
		panic(fmt.Sprintf("raftlog: sync of the Raft log: %v", err))
	}
}

// durable is the last index every node may take as this node's durable
// entry: the log's, or all of them when appends are synced as they come.
func (s *logStore) durable() uint64 {
	if s.deferred == nil {
		return math.MaxUint64
	}
	return s.deferred.Durable()
}

// waitDurable waits until the entries up to index are durable here, or
// the node closes (ErrShutdown).
func (s *logStore) waitDurable(index uint64) error {
	if s.deferred == nil {
		return nil
	}
	if err := s.deferred.WaitDurable(index, s.stop); err != nil {
		return ErrShutdown
	}
	return nil
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
