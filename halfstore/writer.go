package halfstore

import (
	"fmt"
	"sync"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/txmq/txmq/internal/diskio"
)

// Writer is the store's one writer that answers before it commits: Apply
// runs in a read-write transaction it keeps open across calls, and Commit
// commits everything applied since the last commit in one bbolt commit.
// That takes the commit off the path of whoever waits for Apply's result
// (the Raft FSM answers proposers at once), and many Apply calls share one
// commit.
//
// Readers never see a stale store because of it: View, Update, Snapshot
// and Close commit the writer's open transaction first, so every read sees
// everything applied. A commit that fails (the disk is full) leaves the
// writer failed: what was applied since the last commit is gone from the
// store, and every later Apply and read returns the error, which matches
// diskio.ErrWrite, until Retry applies it all again and commits. The FSM
// keeps the entries it applied since its last commit for that.
type Writer struct {
	s *Store

	mu     sync.Mutex
	tx     *bolt.Tx
	failed error
	fault  func() error

	commits atomic.Uint64
}

// Writer returns the store's writer, the same one on every call.
func (s *Store) Writer() *Writer {
	if w := s.writer.Load(); w != nil {
		return w
	}
	s.writer.CompareAndSwap(nil, &Writer{s: s})
	return s.writer.Load()
}

// Apply runs fn in the open transaction, beginning one when none is open.
// An error of fn rolls back everything applied since the last commit; it
// is the writer's failure from then on.
func (w *Writer) Apply(fn func(*Tx) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return w.failed
	}
	if err := w.beginLocked(); err != nil {
		return err
	}
	if err := fn(&Tx{tx: w.tx}); err != nil {
		w.failLocked(err)
		return err
	}
	return nil
}

// beginLocked begins the open transaction unless one is open.
func (w *Writer) beginLocked() error {
	if w.tx != nil {
		return nil
	}
	w.s.mu.RLock()
	if w.s.db == nil {
		w.s.mu.RUnlock()
		return ErrClosed
	}
	tx, err := w.s.db.Begin(true)
	if err != nil {
		w.s.mu.RUnlock()
		return fmt.Errorf("halfstore: begin: %w", err)
	}
	w.tx = tx
	return nil
}

// Retry recovers a writer whose commit failed: it runs fn, which must
// apply again everything applied since the last commit that worked, in a
// new transaction, and commits it. If that works the writer works again;
// if not it stays failed with the new error.
func (w *Writer) Retry(fn func(*Tx) error) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tx != nil {
		return fmt.Errorf("halfstore: retry with a transaction open: the writer has not failed")
	}
	if err := w.beginLocked(); err != nil {
		return err
	}
	if err := fn(&Tx{tx: w.tx}); err != nil {
		w.failLocked(err)
		return w.failed
	}
	w.failed = nil
	return w.commitLocked()
}

// Commit commits the open transaction; without one it does nothing. It
// reports whether it committed anything.
func (w *Writer) Commit() (bool, error) {
	if w == nil {
		return false, nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed != nil {
		return false, w.failed
	}
	if w.tx == nil {
		return false, nil
	}
	if err := w.commitLocked(); err != nil {
		return false, err
	}
	return true, nil
}

// commitLocked commits the open transaction; a failure (bbolt rolled it
// back) leaves the writer failed.
func (w *Writer) commitLocked() error {
	var err error
	if w.fault != nil {
		err = w.fault()
	}
	if err != nil {
		_ = w.tx.Rollback()
	} else {
		err = w.tx.Commit()
	}
	w.tx = nil
	w.s.mu.RUnlock()
	if err != nil {
		w.failed = diskio.WriteFailed("halfstore: commit "+w.s.path, err)
		return w.failed
	}
	w.commits.Add(1)
	return nil
}

// InjectFault makes every later commit call fault first and fail with its
// error, if any, as bbolt's commit fails on a full disk (the transaction
// rolled back). For tests of a failing disk; nil removes it.
func (w *Writer) InjectFault(fault func() error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fault = fault
}

// Commits counts the bbolt commits the writer made.
func (w *Writer) Commits() uint64 { return w.commits.Load() }

// discard drops the open transaction: what it holds is superseded (a
// snapshot replaces the whole store).
func (w *Writer) discard() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.tx != nil {
		_ = w.tx.Rollback()
		w.tx = nil
		w.s.mu.RUnlock()
	}
}

func (w *Writer) failLocked(err error) {
	_ = w.tx.Rollback()
	w.tx = nil
	w.s.mu.RUnlock()
	w.failed = fmt.Errorf("halfstore: writer failed, applied writes since the last commit are lost: %w", err)
}

// Read runs fn against everything applied, without committing: inside the
// open transaction when there is one (applying waits meanwhile), else in
// a read transaction. fn must only read, and briefly: it is for the hot
// reads that follow every apply (the dispatchers'), which would otherwise
// cost a bbolt commit each.
func (w *Writer) Read(fn func(*Tx) error) error {
	w.mu.Lock()
	if w.failed != nil {
		defer w.mu.Unlock()
		return w.failed
	}
	if w.tx == nil {
		w.mu.Unlock()
		return w.s.View(fn)
	}
	defer w.mu.Unlock()
	return fn(&Tx{tx: w.tx})
}

// settle commits the writer's open transaction before a read, so that the
// read sees everything applied.
func (s *Store) settle() error {
	_, err := s.writer.Load().Commit()
	return err
}
