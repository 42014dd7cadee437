// Package wal is txmq's Raft log store: a directory of segment files of
// CRC-framed records, each batch of entries written with one write and made
// durable with one fdatasync into space reserved ahead and written with
// zeros ahead of the tail (no file growth and no extents to convert, so no
// metadata to flush; zero.go), or synced later (StoreLogsDeferred, Sync:
// the leader's appends). It implements hashicorp/raft's LogStore (and
// MonotonicLogStore: a log emptied for a snapshot may start again at any
// index). The stable store (term, vote) is stable.go.
//
// On open, a record that does not check out in the last segment ends the
// log: it is a write that never finished its sync, so no one was told it
// was stored; it and what follows are zeroed. The same anywhere else is
// ErrCorrupt, and the node does not start.
package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/internal/diskio"
)

// DefaultSegmentSize is the space reserved for each segment file.
const DefaultSegmentSize = 64 << 20

// Options configure a Log.
type Options struct {
	// SegmentSize: bytes reserved per segment; DefaultSegmentSize if 0. A
	// batch larger than that gets a segment of its own size.
	SegmentSize int64
	// Logger hears of a torn tail dropped on open; slog.Default() if nil.
	Logger *slog.Logger
	// MaxBatch: the most entries one StoreLogs call writes; DefaultMaxBatch
	// if 0. A damaged record in the last segment followed by that many
	// good ones is corruption, not a torn write.
	MaxBatch int
}

// DefaultMaxBatch is hashicorp/raft's limit of MaxAppendEntries, whatever
// the node's setting was when it wrote the log.
const DefaultMaxBatch = 1024

// Log is a Raft log in a directory of segments. Safe for concurrent use.
type Log struct {
	dir  string
	opts Options

	// wmu orders the writers (StoreLogs on Raft's main loop, DeleteRange
	// also on its snapshot goroutine); mu guards what readers see. An
	// append writes and syncs holding wmu only, and publishes its records
	// under mu, so reads go on during the sync.
	wmu      sync.Mutex
	mu       sync.RWMutex
	segments []*segment // in index order; the last one takes appends
	first    uint64     // first index kept (0 with no entries)
	buf      []byte     // the batch being encoded; wmu

	// Deferred syncs (StoreLogsDeferred). smu orders the syncs after such
	// appends against new segments, deletes and Close (lock order: wmu,
	// smu, mu). Under mu: synced is the last index known durable, dirty
	// the segment holding appends not yet synced (nil when none; never
	// an older segment than the last: a new one is started only once
	// the last is synced), durable closed and replaced when synced moves.
	smu     sync.Mutex
	synced  uint64
	dirty   *segment
	durable chan struct{}

	// The zeroer (zero.go): woken by zeroKick, stopped by zeroStop, gone
	// when zeroDone is closed.
	zeroKick, zeroStop, zeroDone chan struct{}
	zeroOnce                     sync.Once
	// zeroFault, when set (tests), runs before each chunk of zeros; an
	// error fails the chunk as a failed write would.
	zeroFault func() error
}

// ErrStopped: WaitDurable gave up, its stop was closed.
var ErrStopped = errors.New("wal: stopped waiting for a sync")

var (
	_ raft.LogStore          = (*Log)(nil)
	_ raft.MonotonicLogStore = (*Log)(nil)
)

// Open opens the log in dir, creating dir if needed.
func Open(dir string, opts Options) (*Log, error) {
	if opts.SegmentSize <= 0 {
		opts.SegmentSize = DefaultSegmentSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = DefaultMaxBatch
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	bases, err := segmentBases(dir)
	if err != nil {
		return nil, err
	}
	l := &Log{dir: dir, opts: opts}
	for i, base := range bases {
		last := i == len(bases)-1
		s, err := openSegment(dir, base, last, opts)
		if errors.Is(err, errUnwrittenSegment) && last {
			// Created by a crash before its header was synced: nothing
			// was ever stored in it.
			err = os.Remove(segmentPath(dir, base))
			if err == nil {
				break
			}
		}
		if err == nil && len(l.segments) > 0 {
			if prev := l.segments[len(l.segments)-1]; prev.last()+1 != base {
				s.f.Close()
				err = fmt.Errorf("%w: segment %s starts at %d, after %d", ErrCorrupt, s.path, base, prev.last())
			}
		}
		if err != nil {
			l.closeSegments()
			return nil, fmt.Errorf("wal: open %s: %w", dir, err)
		}
		l.segments = append(l.segments, s)
	}
	if len(l.segments) > 0 && l.lastIndex() >= l.segments[0].base {
		l.first = l.segments[0].base
	}
	// A process killed after a deferred append leaves it in the page
	// cache only: everything read here is made durable before anyone is
	// told it is stored.
	if len(l.segments) > 0 {
		s := l.segments[len(l.segments)-1]
		if err := datasync(s.f); err != nil {
			l.closeSegments()
			return nil, diskio.WriteFailed("wal: sync "+s.path, err)
		}
	}
	l.synced, l.durable = l.lastIndex(), make(chan struct{})
	l.zeroKick, l.zeroStop, l.zeroDone = make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	go l.zeroer()
	l.zeroKick <- struct{}{}
	return l, nil
}

// IsMonotonic tells Raft to empty the log after installing a snapshot
// rather than keep entries before it: appends are contiguous, except on an
// empty log.
func (l *Log) IsMonotonic() bool { return true }

func (l *Log) lastIndex() uint64 {
	if len(l.segments) == 0 {
		return 0
	}
	return l.segments[len(l.segments)-1].last()
}

// FirstIndex is the first index stored, 0 with none.
func (l *Log) FirstIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.first, nil
}

// LastIndex is the last index stored, 0 with none.
func (l *Log) LastIndex() (uint64, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.first == 0 {
		return 0, nil
	}
	return l.lastIndex(), nil
}

// GetLog reads the entry of index into out.
func (l *Log) GetLog(index uint64, out *raft.Log) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.first == 0 || index < l.first || index > l.lastIndex() {
		return raft.ErrLogNotFound
	}
	i := sort.Search(len(l.segments), func(i int) bool { return l.segments[i].base > index }) - 1
	s := l.segments[i]
	k := index - s.base
	if _, _, err := s.readAt(s.f, s.offsets[k], s.prev(k), out); err != nil {
		return fmt.Errorf("wal: read index %d in %s: %w", index, s.path, err)
	}
	if out.Index != index {
		return fmt.Errorf("wal: read index %d in %s: %w: found index %d", index, s.path, ErrCorrupt, out.Index)
	}
	return nil
}

// StoreLog stores one entry.
func (l *Log) StoreLog(log *raft.Log) error { return l.StoreLogs([]*raft.Log{log}) }

// StoreLogs appends logs, which must follow the last index (or start
// anywhere on an empty log), durably: one write and one fdatasync per
// segment touched.
func (l *Log) StoreLogs(logs []*raft.Log) error { return l.store(logs, true) }

// StoreLogsDeferred appends logs as StoreLogs does, but returns before
// they are durable: Sync makes them so, Durable and WaitDurable tell how
// far that is. Readers see them at once. At most MaxBatch entries are
// ever waiting for a sync (more, and this syncs the ones before first),
// and only in the last segment (a new segment is started once the last is
// synced), so a power cut tears the log no deeper than one batch, which
// Open tells from corruption.
func (l *Log) StoreLogsDeferred(logs []*raft.Log) error { return l.store(logs, false) }

func (l *Log) store(logs []*raft.Log, sync bool) error {
	if len(logs) == 0 {
		return nil
	}
	l.wmu.Lock()
	defer l.wmu.Unlock()
	if !sync && l.waiting()+len(logs) > l.opts.MaxBatch {
		if err := l.Sync(); err != nil {
			return err
		}
	}
	next := logs[0].Index
	if l.first != 0 && next != l.lastIndex()+1 {
		return fmt.Errorf("wal: append of index %d after %d: entries must be contiguous", next, l.lastIndex())
	}
	if l.first == 0 && len(l.segments) > 0 {
		// Empty segments left by a crash or a suffix delete: the log may
		// start anywhere.
		l.mu.Lock()
		err := l.deleteAll()
		l.clampSynced()
		l.mu.Unlock()
		if err != nil {
			return err
		}
	}
	for len(logs) > 0 {
		s, err := l.segmentFor(logs[0])
		if err != nil {
			return err
		}
		n, err := l.write(s, logs, sync)
		if err != nil {
			return err
		}
		logs = logs[n:]
	}
	if l.first == 0 {
		l.mu.Lock()
		l.first = next
		l.mu.Unlock()
	}
	return nil
}

// segmentFor is the segment that takes log next: the last one if it has
// room for it, else a new one.
func (l *Log) segmentFor(log *raft.Log) (*segment, error) {
	if len(l.segments) > 0 {
		s := l.segments[len(l.segments)-1]
		if s.tail+int64(recordSize(log)) <= s.size {
			return s, nil
		}
	}
	if err := l.Sync(); err != nil {
		return nil, err
	}
	size := max(l.opts.SegmentSize, int64(segmentHeader+recordSize(log)))
	s, err := createSegment(l.dir, log.Index, size)
	if err != nil {
		return nil, diskio.WriteFailed(fmt.Sprintf("wal: new segment at %d", log.Index), err)
	}
	l.mu.Lock()
	l.segments = append(l.segments, s)
	l.mu.Unlock()
	return s, nil
}

// write appends to s as many of logs as fit (at least one) with one write
// and, if sync, one fdatasync, and returns how many.
func (l *Log) write(s *segment, logs []*raft.Log, sync bool) (int, error) {
	b := l.buf[:0]
	var offsets []int64
	var crcs []uint32
	crc := s.prev(uint64(len(s.offsets)))
	n := 0
	for _, log := range logs {
		if n > 0 && s.tail+int64(len(b)+recordSize(log)) > s.size {
			break
		}
		if want := s.base + uint64(len(s.offsets)+n); log.Index != want {
			return 0, fmt.Errorf("wal: append of index %d where %d belongs: entries must be contiguous", log.Index, want)
		}
		offsets = append(offsets, s.tail+int64(len(b)))
		b, crc = appendRecord(b, log, crc)
		crcs = append(crcs, crc)
		n++
	}
	l.buf = b
	if _, err := s.f.WriteAt(b, s.tail); err != nil {
		s.unwrite(len(b))
		return 0, diskio.WriteFailed("wal: write "+s.path, err)
	}
	if sync {
		if err := datasync(s.f); err != nil {
			s.unwrite(len(b))
			return 0, diskio.WriteFailed("wal: sync "+s.path, err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	s.offsets = append(s.offsets, offsets...)
	s.crcs = append(s.crcs, crcs...)
	s.tail += int64(len(b))
	l.kickZeroer(s)
	if sync {
		// One fdatasync of s covers the deferred appends before it too.
		l.markSynced(l.lastIndex())
	} else {
		l.dirty = s
	}
	return n, nil
}

// waiting is how many entries are stored but not yet synced; wmu.
func (l *Log) waiting() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.dirty == nil {
		return 0
	}
	return int(l.lastIndex() - max(l.synced, l.dirty.base-1))
}

// Sync makes every append stored so far durable, with one fdatasync of
// the last segment when deferred appends wait for it (nothing otherwise).
func (l *Log) Sync() error {
	l.smu.Lock()
	defer l.smu.Unlock()
	l.mu.RLock()
	s, target := l.dirty, l.lastIndex()
	l.mu.RUnlock()
	if s == nil {
		return nil
	}
	if err := datasync(s.f); err != nil {
		return diskio.WriteFailed("wal: sync "+s.path, err)
	}
	l.mu.Lock()
	l.markSynced(target)
	l.mu.Unlock()
	return nil
}

// markSynced records that the entries up to index are durable; mu.
func (l *Log) markSynced(index uint64) {
	if index > l.synced {
		l.synced = index
		close(l.durable)
		l.durable = make(chan struct{})
	}
	if l.synced >= l.lastIndex() {
		l.dirty = nil
	}
}

// Durable is the last index known durable: every entry up to it survives
// a power cut.
func (l *Log) Durable() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.synced
}

// WaitDurable waits until the entries up to index are durable, or stop is
// closed (ErrStopped).
func (l *Log) WaitDurable(index uint64, stop <-chan struct{}) error {
	for {
		l.mu.RLock()
		done, moved := l.synced >= index, l.durable
		l.mu.RUnlock()
		if done {
			return nil
		}
		select {
		case <-moved:
		case <-stop:
			return ErrStopped
		}
	}
}

// DeleteRange deletes the entries min to max, inclusive: a prefix (log
// compaction), a suffix (entries a new leader overrode), or all. A prefix
// is dropped a whole segment at a time; FirstIndex moves at once, and after
// a restart starts again at the first segment kept.
func (l *Log) DeleteRange(min, max uint64) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	l.smu.Lock()
	defer l.smu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	defer l.clampSynced()
	if l.first == 0 || max < min || max < l.first || min > l.lastIndex() {
		return nil
	}
	last := l.lastIndex()
	switch {
	case min <= l.first && max >= last:
		return l.deleteAll()
	case min <= l.first:
		return l.deletePrefix(max)
	case max >= last:
		return l.deleteSuffix(min)
	}
	return fmt.Errorf("wal: delete of %d..%d inside %d..%d: only a prefix or a suffix can be deleted", min, max, l.first, last)
}

// deleteAll removes every segment; the caller holds wmu and mu.
func (l *Log) deleteAll() error {
	for _, s := range l.segments {
		if err := s.remove(); err != nil {
			return fmt.Errorf("wal: remove %s: %w", s.path, err)
		}
	}
	l.segments, l.first = nil, 0
	return diskio.SyncDir(l.dir)
}

func (l *Log) deletePrefix(max uint64) error {
	l.first = max + 1
	removed := false
	for len(l.segments) > 1 && l.segments[0].last() <= max {
		if err := l.segments[0].remove(); err != nil {
			return fmt.Errorf("wal: remove %s: %w", l.segments[0].path, err)
		}
		l.segments = l.segments[1:]
		removed = true
	}
	if !removed {
		return nil
	}
	return diskio.SyncDir(l.dir)
}

func (l *Log) deleteSuffix(min uint64) error {
	removed := false
	for len(l.segments) > 0 && l.segments[len(l.segments)-1].base >= min {
		s := l.segments[len(l.segments)-1]
		if err := s.remove(); err != nil {
			return fmt.Errorf("wal: remove %s: %w", s.path, err)
		}
		l.segments = l.segments[:len(l.segments)-1]
		removed = true
	}
	if removed {
		if err := diskio.SyncDir(l.dir); err != nil {
			return err
		}
	}
	if len(l.segments) == 0 {
		l.first = 0
		return nil
	}
	s := l.segments[len(l.segments)-1]
	if min > s.last() {
		return nil
	}
	if err := s.truncate(min); err != nil {
		return fmt.Errorf("wal: truncate %s at %d: %w", s.path, min, err)
	}
	return nil
}

// clampSynced keeps synced and dirty within what a delete left; mu.
func (l *Log) clampSynced() {
	last := l.lastIndex()
	if l.first == 0 {
		last = 0
	}
	l.synced = min(l.synced, last)
	if l.dirty != nil && (l.synced >= last || !slices.Contains(l.segments, l.dirty)) {
		l.dirty = nil
	}
}

// Close syncs what deferred appends left and closes the segment files.
func (l *Log) Close() error {
	l.stopZeroer()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	syncErr := l.Sync()
	l.smu.Lock()
	defer l.smu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dirty = nil
	return errors.Join(syncErr, l.closeSegments())
}

func (l *Log) closeSegments() error {
	var errs []error
	for _, s := range l.segments {
		errs = append(errs, s.f.Close())
	}
	l.segments = nil
	return errors.Join(errs...)
}
