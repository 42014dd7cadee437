package wal

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/internal/syncbuf"
)

func entry(index, term uint64, size int) *raft.Log {
	data := bytes.Repeat([]byte{byte(index)}, size)
	return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: data, AppendedAt: time.Unix(0, int64(index)*1000)}
}

func mustOpen(t *testing.T, dir string, opts Options) *Log {
	t.Helper()
	l, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return l
}

// model is what a log must hold: entries by index, first..last.
type model struct {
	entries     map[uint64]*raft.Log
	first, last uint64
}

// check compares l with m: the bounds, and every entry's fields.
func (m *model) check(t *testing.T, l *Log, step string) {
	t.Helper()
	first, _ := l.FirstIndex()
	last, _ := l.LastIndex()
	if last != m.last {
		t.Fatalf("%s: last index %d, want %d", step, last, m.last)
	}
	// After a restart, a prefix delete is undone up to the segment it
	// began in: FirstIndex may be lower than the model's, never higher.
	if first > m.first || (m.first == 0) != (first == 0) {
		t.Fatalf("%s: first index %d, want %d (or lower, with entries)", step, first, m.first)
	}
	for i := m.first; i != 0 && i <= m.last; i++ {
		var got raft.Log
		if err := l.GetLog(i, &got); err != nil {
			t.Fatalf("%s: get %d: %v", step, i, err)
		}
		want := m.entries[i]
		if got.Index != want.Index || got.Term != want.Term || got.Type != want.Type || !bytes.Equal(got.Data, want.Data) || !got.AppendedAt.Equal(want.AppendedAt) {
			t.Fatalf("%s: entry %d is %+v, want %+v", step, i, got, want)
		}
	}
	var got raft.Log
	if err := l.GetLog(m.last+1, &got); !errors.Is(err, raft.ErrLogNotFound) {
		t.Fatalf("%s: get %d past the end: %v", step, m.last+1, err)
	}
}

// TestRandomWalk appends, deletes prefixes and suffixes, empties and
// reopens a log with small segments, against a map of what it must hold.
func TestRandomWalk(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			dir := t.TempDir()
			opts := Options{SegmentSize: 4 << 10}
			l := mustOpen(t, dir, opts)
			defer func() { l.Close() }()
			m := &model{entries: map[uint64]*raft.Log{}}
			term := uint64(1)
			for step := range 400 {
				name := fmt.Sprintf("step %d", step)
				switch op := rng.IntN(20); {
				case op < 12: // append a batch
					start := m.last + 1
					if m.last == 0 {
						start = 1 + rng.Uint64N(1000)
					}
					var batch []*raft.Log
					for i := range uint64(1 + rng.IntN(8)) {
						// Some entries larger than a segment.
						size := rng.IntN(300)
						if rng.IntN(40) == 0 {
							size = 6 << 10
						}
						batch = append(batch, entry(start+i, term, size))
					}
					store := l.StoreLogs
					if rng.IntN(2) == 0 {
						store = l.StoreLogsDeferred
					}
					if err := store(batch); err != nil {
						t.Fatalf("%s: store: %v", name, err)
					}
					for _, e := range batch {
						m.entries[e.Index] = e
					}
					if m.first == 0 {
						m.first = start
					}
					m.last = batch[len(batch)-1].Index
				case op < 14 && m.last != 0: // compact a prefix
					max := m.first + rng.Uint64N(m.last-m.first+1)
					if max == m.last {
						max--
					}
					if max < m.first {
						continue
					}
					if err := l.DeleteRange(m.first, max); err != nil {
						t.Fatalf("%s: delete prefix: %v", name, err)
					}
					m.first = max + 1
				case op < 17 && m.last != 0: // a new leader's suffix
					min := m.first + 1 + rng.Uint64N(m.last-m.first+1)
					if min > m.last {
						continue
					}
					if err := l.DeleteRange(min, m.last); err != nil {
						t.Fatalf("%s: delete suffix: %v", name, err)
					}
					m.last = min - 1
					term++
				case op < 18 && m.last != 0: // a snapshot installed: all
					if err := l.DeleteRange(m.first, m.last); err != nil {
						t.Fatalf("%s: delete all: %v", name, err)
					}
					m.first, m.last = 0, 0
				default: // restart
					if err := l.Close(); err != nil {
						t.Fatal(err)
					}
					l = mustOpen(t, dir, opts)
					if first, _ := l.FirstIndex(); first != 0 && first < m.first {
						// What the model compacted and the log kept.
						for i := first; i < m.first; i++ {
							var e raft.Log
							if err := l.GetLog(i, &e); err != nil {
								t.Fatalf("%s: kept entry %d: %v", name, i, err)
							}
						}
						m.first = first
					}
				}
				m.check(t, l, name)
				checkDurable(t, l, name)
				if rng.IntN(4) == 0 {
					if err := l.Sync(); err != nil {
						t.Fatalf("%s: sync: %v", name, err)
					}
					if d, last := l.Durable(), m.last; d != last {
						t.Fatalf("%s: durable %d after a sync, last %d", name, d, last)
					}
				}
			}
		})
	}
}

// checkDurable checks what deferred appends may leave: the durable index
// within the log, appends waiting for a sync only in the last segment, no
// more than MaxBatch of them.
func checkDurable(t *testing.T, l *Log, step string) {
	t.Helper()
	l.mu.RLock()
	defer l.mu.RUnlock()
	last := l.lastIndex()
	if l.first == 0 {
		last = 0
	}
	if l.synced > last {
		t.Fatalf("%s: durable %d past the last index %d", step, l.synced, last)
	}
	if l.dirty == nil {
		if l.synced != last {
			t.Fatalf("%s: nothing waits for a sync, yet durable %d and last %d", step, l.synced, last)
		}
		return
	}
	if l.dirty != l.segments[len(l.segments)-1] {
		t.Fatalf("%s: appends wait for a sync in %s, not in the last segment", step, l.dirty.path)
	}
	if l.synced < l.dirty.base-1 && l.dirty != l.segments[0] {
		t.Fatalf("%s: durable %d, before the segment %s that waits for a sync", step, l.synced, l.dirty.path)
	}
}

// A deferred append is readable at once and durable after Sync; what waits
// for it is released then, or by its stop; more than MaxBatch waiting, or
// a new segment, syncs what was there first; a synced append, Close and
// Open leave nothing waiting.
func TestDeferredAppend(t *testing.T) {
	dir := t.TempDir()
	opts := Options{SegmentSize: 4 << 10, MaxBatch: 4}
	l := mustOpen(t, dir, opts)
	defer func() { l.Close() }()
	batch := func(from, to uint64, size int) []*raft.Log {
		var b []*raft.Log
		for i := from; i <= to; i++ {
			b = append(b, entry(i, 1, size))
		}
		return b
	}
	if err := l.StoreLogs(batch(1, 3, 10)); err != nil {
		t.Fatal(err)
	}
	if err := l.StoreLogsDeferred(batch(4, 5, 10)); err != nil {
		t.Fatal(err)
	}
	var e raft.Log
	if err := l.GetLog(5, &e); err != nil {
		t.Fatalf("a deferred append is not readable: %v", err)
	}
	if d := l.Durable(); d != 3 {
		t.Fatalf("durable %d after a deferred append, want 3", d)
	}
	stop := make(chan struct{})
	close(stop)
	if err := l.WaitDurable(5, stop); !errors.Is(err, ErrStopped) {
		t.Fatalf("a wait whose stop is closed: %v, want ErrStopped", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- l.WaitDurable(5, make(chan struct{})) }()
	select {
	case err := <-waited:
		t.Fatalf("the wait for 5 ended (%v) before a sync", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if d := l.Durable(); d != 5 {
		t.Fatalf("durable %d after Sync, want 5", d)
	}

	// Two waiting, three more: over MaxBatch, so the two are synced first.
	if err := l.StoreLogsDeferred(batch(6, 7, 10)); err != nil {
		t.Fatal(err)
	}
	if err := l.StoreLogsDeferred(batch(8, 10, 10)); err != nil {
		t.Fatal(err)
	}
	if d := l.Durable(); d != 7 {
		t.Fatalf("durable %d, want 7: the appends before a batch that makes more than MaxBatch wait are synced", d)
	}
	// Entries that fill the segment: the next goes to a new one, once the
	// last is synced.
	if err := l.StoreLogsDeferred(batch(11, 14, 1<<10)); err != nil {
		t.Fatal(err)
	}
	if got := len(l.segments); got != 2 {
		t.Fatalf("%d segments, want 2", got)
	}
	if d := l.Durable(); d != l.segments[0].last() {
		t.Fatalf("durable %d, want %d: a new segment starts once the last is synced", d, l.segments[0].last())
	}
	checkDurable(t, l, "after the new segment")
	if err := l.StoreLogs(batch(15, 15, 10)); err != nil {
		t.Fatal(err)
	}
	if d := l.Durable(); d != 15 {
		t.Fatalf("durable %d after a synced append, want 15", d)
	}
	if err := l.StoreLogsDeferred(batch(16, 16, 10)); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, dir, opts)
	if d, last := l.Durable(), uint64(16); d != last {
		t.Fatalf("durable %d after a restart, want %d", d, last)
	}
}

func TestAppendMustBeContiguous(t *testing.T) {
	l := mustOpen(t, t.TempDir(), Options{})
	defer l.Close()
	if err := l.StoreLogs([]*raft.Log{entry(5, 1, 10), entry(6, 1, 10)}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range [][]*raft.Log{{entry(8, 1, 1)}, {entry(6, 1, 1)}, {entry(7, 1, 1), entry(9, 1, 1)}} {
		if err := l.StoreLogs(bad); err == nil {
			t.Fatalf("append of %d after 6 succeeded", bad[0].Index)
		}
	}
	if last, _ := l.LastIndex(); last != 6 {
		t.Fatalf("last %d after refused appends, want 6", last)
	}
	// Emptied, the log may start anywhere (after a snapshot).
	if err := l.DeleteRange(5, 6); err != nil {
		t.Fatal(err)
	}
	if err := l.StoreLogs([]*raft.Log{entry(100, 2, 10)}); err != nil {
		t.Fatalf("append at 100 on an empty log: %v", err)
	}
	(&model{entries: map[uint64]*raft.Log{}}).checkBatch(t, l, []*raft.Log{entry(100, 2, 10)})
}

func TestDeleteInTheMiddleRefused(t *testing.T) {
	l := mustOpen(t, t.TempDir(), Options{})
	defer l.Close()
	var batch []*raft.Log
	for i := uint64(1); i <= 10; i++ {
		batch = append(batch, entry(i, 1, 10))
	}
	if err := l.StoreLogs(batch); err != nil {
		t.Fatal(err)
	}
	if err := l.DeleteRange(3, 5); err == nil {
		t.Fatal("a delete inside the log succeeded")
	}
	(&model{entries: map[uint64]*raft.Log{}}).checkBatch(t, l, batch)
}

func (m *model) checkBatch(t *testing.T, l *Log, batch []*raft.Log) {
	t.Helper()
	for _, e := range batch {
		m.entries[e.Index] = e
	}
	m.first, m.last = batch[0].Index, batch[len(batch)-1].Index
	m.check(t, l, "after")
}

// waitZeroed waits until the zeroer has caught up with the appends: its
// zeros reach as far ahead of the last segment's tail as they do, within
// a chunk.
func waitZeroed(t *testing.T, l *Log) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.wmu.Lock()
		s := l.lastSegment()
		done := s == nil || !zeroBehind(s)
		l.wmu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the zeroer did not catch up within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkAppendSync times one synced append of one entry, into space
// the zeroer wrote ahead of the tail (zeroed) and into space only
// reserved (reserved: the zeroer stopped before the first append), for
// entries of a transaction's size at one producer and of a merged entry at
// sixteen (docs/decisions.md › Zeros ahead of the tail).
func BenchmarkAppendSync(b *testing.B) {
	for _, size := range []int{300, 4096} {
		for _, mode := range []string{"zeroed", "reserved"} {
			b.Run(fmt.Sprintf("%s/%dB", mode, size), func(b *testing.B) {
				l, err := Open(b.TempDir(), Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				if mode == "reserved" {
					l.stopZeroer()
				}
				b.SetBytes(int64(size))
				for i := range b.N {
					if err := l.StoreLogs([]*raft.Log{entry(uint64(i+1), 1, size)}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// A zeroer whose writes fail warns once, leaves the segment alone for
// zeroRetry, tries again while they fail without warning again, and
// catches up once they work; the appends go on meanwhile.
func TestZeroerRetriesAfterAFailure(t *testing.T) {
	defer func(d time.Duration) { zeroRetry = d }(zeroRetry)
	zeroRetry = 20 * time.Millisecond
	const warning = "could not write zeros ahead"
	logs := &syncbuf.Buffer{}
	l := mustOpen(t, t.TempDir(), Options{SegmentSize: 16 << 20, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer func() { l.Close() }()
	var (
		faults atomic.Int64
		first  time.Time // of the failures; the zeroer's, under wmu
	)
	setFault := func(f func() error) {
		l.wmu.Lock()
		l.zeroFault = f
		l.wmu.Unlock()
	}
	setFault(func() error {
		if faults.Add(1) == 1 {
			first = time.Now()
		}
		return errors.New("injected: the disk refused a write")
	})
	var next uint64
	appendOne := func() {
		t.Helper()
		next++
		if err := l.StoreLogs([]*raft.Log{entry(next, 1, 4000)}); err != nil {
			t.Fatalf("append %d while the zeroer fails: %v", next, err)
		}
	}
	appendOne()
	firstSegment := l.lastSegment()
	deadline := time.Now().Add(10 * time.Second)
	for faults.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the zeroer tried %d times in 10 s, want 3", faults.Load())
		}
		appendOne()
		time.Sleep(time.Millisecond)
	}
	if n := strings.Count(logs.String(), warning); n != 1 {
		t.Fatalf("%d warnings after %d failures, want 1", n, faults.Load())
	}
	l.wmu.Lock()
	since, s := time.Since(first), l.lastSegment()
	tail, zeroed := s.tail, s.zeroed
	l.wmu.Unlock()
	if s != firstSegment {
		t.Fatalf("the log started %s before the zeroer failed 3 times: it does not try a segment again", s.path)
	}
	if since < 2*zeroRetry {
		t.Fatalf("3 tries in %v: the zeroer does not wait %v after a failure", since, zeroRetry)
	}
	if zeroed > tail {
		t.Fatalf("zeros reach %d past the tail %d while every chunk failed", zeroed, tail)
	}
	setFault(nil)
	for {
		l.wmu.Lock()
		done := !zeroBehind(l.lastSegment())
		l.wmu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the zeroer did not catch up within 10 s once its writes worked")
		}
		appendOne()
		time.Sleep(time.Millisecond)
	}
}
