package wal

import (
	"encoding/binary"
	"os"
	"syscall"
	"testing"
	"unsafe"

	"github.com/hashicorp/raft"
)

// extent is one extent of a file's map, as FS_IOC_FIEMAP tells it.
type extent struct {
	start, end int64
	unwritten  bool
}

// fiemap reads f's extent map (its first 512 extents), syncing the file
// first; it skips the test where the file system cannot tell.
func fiemap(t *testing.T, f *os.File) []extent {
	t.Helper()
	const (
		fsIocFiemap     = 0xC020660B // _IOWR('f', 11, struct fiemap)
		fiemapFlagSync  = 0x1
		extentUnwritten = 0x800
		maxExtents      = 512
		header, size    = 32, 56 // struct fiemap, struct fiemap_extent
	)
	le := binary.LittleEndian
	buf := make([]byte, header+maxExtents*size)
	le.PutUint64(buf[8:], ^uint64(0)) // fm_length: to the end
	le.PutUint32(buf[16:], fiemapFlagSync)
	le.PutUint32(buf[24:], maxExtents)
	_, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), fsIocFiemap, uintptr(unsafe.Pointer(&buf[0])))
	if errno != 0 {
		t.Skipf("the file system cannot map a file's extents (FS_IOC_FIEMAP: %v)", errno)
	}
	var out []extent
	for i := range int(le.Uint32(buf[20:])) {
		e := buf[header+i*size:]
		start := int64(le.Uint64(e))
		out = append(out, extent{start: start, end: start + int64(le.Uint64(e[16:])), unwritten: le.Uint32(e[40:])&extentUnwritten != 0})
	}
	return out
}

// blocks says whether f's blocks from start to end are all written, and
// whether none is (a block is written unless in a hole or an unwritten
// extent).
func blocks(t *testing.T, f *os.File, start, end int64) (all, none bool) {
	t.Helper()
	at, none := start, true
	for _, e := range fiemap(t, f) {
		if e.end <= start || e.start >= end || e.unwritten {
			continue
		}
		none = false
		if e.start <= at {
			at = max(at, e.end)
		}
	}
	return at >= end, none
}

// The zeroer writes the space just ahead of the last segment's tail, and
// no further, in every segment the log starts: a fresh segment's reserved
// blocks are unwritten extents, the ones ahead of the tail are written
// once the zeroer has run, the rest of the segment stays unwritten, and
// every record reads back, before and after a restart.
func TestZerosAheadOfTheTail(t *testing.T) {
	dir := t.TempDir()
	const size = 4 << 20
	opts := Options{SegmentSize: size}
	l := mustOpen(t, dir, opts)
	defer func() { l.Close() }()
	m := &model{entries: map[uint64]*raft.Log{}}
	appendN := func(n int) {
		t.Helper()
		for range n {
			e := entry(m.last+1, 1, 4000)
			if err := l.StoreLogs([]*raft.Log{e}); err != nil {
				t.Fatal(err)
			}
			m.entries[e.Index], m.last = e, e.Index
			m.first = max(m.first, 1)
		}
	}
	appendN(1)
	first := l.lastSegment()
	if _, none := blocks(t, first.f, size-zeroChunk, size); !none {
		t.Skip("this file system reserves a segment's space as written blocks: there is nothing for the zeroer to do")
	}
	check := func(s *segment, step string) {
		t.Helper()
		waitZeroed(t, l)
		l.wmu.Lock()
		tail, zeroed := s.tail, s.zeroed
		l.wmu.Unlock()
		if zeroed < tail+zeroAhead-zeroChunk || zeroed > tail+zeroAhead+zeroChunk {
			t.Fatalf("%s: zeros reach %d, tail at %d: want them %d ahead, within a chunk", step, zeroed, tail, zeroAhead)
		}
		if all, _ := blocks(t, s.f, 0, zeroed); !all {
			t.Fatalf("%s: the segment is not all written up to %d (tail %d): %+v", step, zeroed, tail, fiemap(t, s.f))
		}
		if _, none := blocks(t, s.f, zeroed, size); !none {
			t.Fatalf("%s: the segment has blocks written past the zeros' reach %d (tail %d): %+v", step, zeroed, tail, fiemap(t, s.f))
		}
	}
	appendN(300)
	check(first, "first segment")
	for l.lastSegment() == first {
		appendN(1)
	}
	appendN(300)
	check(l.lastSegment(), "second segment")
	m.check(t, l, "appended")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = mustOpen(t, dir, opts)
	m.check(t, l, "reopened")
}
