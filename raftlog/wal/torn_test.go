package wal

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/raft"
)

// writeLog stores entries 1..n in batches of batch into a log in dir and
// closes it; it returns the entries.
func writeLog(t *testing.T, dir string, opts Options, n, batch, size int) []*raft.Log {
	t.Helper()
	l := mustOpen(t, dir, opts)
	var all []*raft.Log
	for i := 1; i <= n; i += batch {
		var b []*raft.Log
		for j := i; j < i+batch && j <= n; j++ {
			b = append(b, entry(uint64(j), 1, size))
		}
		if err := l.StoreLogs(b); err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return all
}

func segmentFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	if err != nil || len(names) == 0 {
		t.Fatalf("segments in %s: %v %v", dir, names, err)
	}
	return names
}

// recordOffset is where entry index starts in the log in dir.
func recordOffset(t *testing.T, dir string, index uint64) (string, int64) {
	t.Helper()
	l := mustOpen(t, dir, Options{})
	defer l.Close()
	for _, s := range l.segments {
		if index >= s.base && index <= s.last() {
			return s.path, s.offsets[index-s.base]
		}
	}
	t.Fatalf("no entry %d", index)
	return "", 0
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x5a
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// reopenLast opens dir and checks that it holds exactly want[:last],
// then that it takes the next append and keeps it across a reopen.
func reopenLast(t *testing.T, dir string, want []*raft.Log, last uint64) {
	t.Helper()
	l := mustOpen(t, dir, Options{})
	m := &model{entries: map[uint64]*raft.Log{}}
	m.checkBatch(t, l, want[:last])
	next := entry(last+1, 2, 50)
	if err := l.StoreLogs([]*raft.Log{next}); err != nil {
		t.Fatalf("append after recovery: %v", err)
	}
	l.Close()
	l = mustOpen(t, dir, Options{})
	defer l.Close()
	m.checkBatch(t, l, append(append([]*raft.Log(nil), want[:last]...), next))
}

// TestTornLastRecord: a byte flipped in the log's last record (what a
// write that never reached the disk leaves): the open ends the log before
// it.
func TestTornLastRecord(t *testing.T) {
	t.Run("byte flipped", func(t *testing.T) {
		dir := t.TempDir()
		all := writeLog(t, dir, Options{}, 20, 4, 100)
		path, off := recordOffset(t, dir, 20)
		flipByte(t, path, off+frameHeader+40)
		reopenLast(t, dir, all, 19)
	})
	t.Run("length flipped", func(t *testing.T) {
		dir := t.TempDir()
		all := writeLog(t, dir, Options{}, 20, 4, 100)
		path, off := recordOffset(t, dir, 20)
		flipByte(t, path, off)
		reopenLast(t, dir, all, 19)
	})
	t.Run("bad record inside the last segment ends the log there", func(t *testing.T) {
		dir := t.TempDir()
		all := writeLog(t, dir, Options{}, 20, 4, 100)
		path, off := recordOffset(t, dir, 15)
		flipByte(t, path, off+frameHeader+3)
		reopenLast(t, dir, all, 14)
	})
}

// TestDamageIsNotATornWrite: damage that no unfinished append can leave
// makes the open fail naming the file, rather than drop entries the node
// acknowledged: the last segment cut short inside a record (a segment has
// its full size before any record is written), and a damaged record
// followed by more good ones than one append writes.
func TestDamageIsNotATornWrite(t *testing.T) {
	t.Run("cut short", func(t *testing.T) {
		dir := t.TempDir()
		writeLog(t, dir, Options{}, 20, 4, 100)
		path, off := recordOffset(t, dir, 12)
		if err := os.Truncate(path, off+30); err != nil {
			t.Fatal(err)
		}
		_, err := Open(dir, Options{})
		if !errors.Is(err, ErrCorrupt) || !errors.Is(err, errPastEnd) {
			t.Fatalf("open of a segment cut short: %v, want ErrCorrupt (cut short)", err)
		}
	})
	t.Run("good records after a damaged one", func(t *testing.T) {
		dir := t.TempDir()
		opts := Options{MaxBatch: 4}
		writeLog(t, dir, opts, 20, 4, 100)
		path, off := recordOffset(t, dir, 10)
		flipByte(t, path, off+frameHeader+40)
		_, err := Open(dir, opts)
		if !errors.Is(err, ErrCorrupt) || !errors.Is(err, errDataAfter) {
			t.Fatalf("open with record 10 of 20 damaged: %v, want ErrCorrupt (records after it)", err)
		}
	})
}

// TestStaleRecordsNotResurrected: a batch whose first page was lost but
// whose later records reached the disk (a power cut with the page cache
// written out of order) leaves records after the end of the log. New
// entries written over the start of that space must not join them to the
// log on the next open: the chained checksum rejects them.
func TestStaleRecordsNotResurrected(t *testing.T) {
	dir := t.TempDir()
	all := writeLog(t, dir, Options{}, 10, 10, 100)
	path, off6 := recordOffset(t, dir, 6)
	// Entry 6 lost: zeros where it was; 7..10 still there.
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, recordSize(all[5])), off6); err != nil {
		t.Fatal(err)
	}
	f.Close()
	l := mustOpen(t, dir, Options{})
	(&model{entries: map[uint64]*raft.Log{}}).checkBatch(t, l, all[:5])
	// A new leader's entry 6, the same size as the lost one, so that the
	// old entry 7 follows it exactly.
	six := entry(6, 2, 100)
	if err := l.StoreLogs([]*raft.Log{six}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	l = mustOpen(t, dir, Options{})
	defer l.Close()
	if last, _ := l.LastIndex(); last != 6 {
		t.Fatalf("last index %d after reopen, want 6: an old entry came back", last)
	}
}

// TestCorruptSealedSegment: damage in a segment that is not the last one
// cannot be a write in progress; the log refuses to open.
func TestCorruptSealedSegment(t *testing.T) {
	for _, what := range []string{"record", "header"} {
		t.Run(what, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{SegmentSize: 2 << 10}
			writeLog(t, dir, opts, 60, 3, 100)
			if n := len(segmentFiles(t, dir)); n < 3 {
				t.Fatalf("%d segments, want several", n)
			}
			path, off := recordOffset(t, dir, 3)
			at := off + frameHeader + 5
			if what == "header" {
				at = 3
			}
			flipByte(t, path, at)
			if _, err := Open(dir, opts); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open with a damaged sealed segment: %v, want ErrCorrupt", err)
			}
		})
	}
}

// TestUnwrittenLastSegment: a segment file created by a crash before its
// header reached the disk holds nothing; the open removes it.
func TestUnwrittenLastSegment(t *testing.T) {
	dir := t.TempDir()
	all := writeLog(t, dir, Options{}, 10, 5, 100)
	if err := os.WriteFile(segmentPath(dir, 11), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	reopenLast(t, dir, all, 10)
}

func TestStable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stable")
	s, err := OpenStable(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetUint64([]byte("CurrentTerm")); err == nil || err.Error() != "not found" {
		t.Fatalf("missing key: %v, want hashicorp/raft's \"not found\"", err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 7); err != nil {
		t.Fatal(err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("node-2")); err != nil {
		t.Fatal(err)
	}
	s, err = OpenStable(path)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 7 {
		t.Fatalf("term after reopen: %d %v", v, err)
	}
	if v, err := s.Get([]byte("LastVoteCand")); err != nil || string(v) != "node-2" {
		t.Fatalf("vote after reopen: %q %v", v, err)
	}
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// A byte changed in a key's name still makes valid JSON: the checksum
	// tells.
	bad := bytes.Replace(good, []byte("CurrentTerm"), []byte("CurrentTerX"), 1)
	for _, b := range [][]byte{bad, []byte("{not json"), good[:len(good)/2]} {
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenStable(path); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("damaged stable store %q: %v, want ErrCorrupt", b, err)
		}
	}
	// A file from before the header is read as it is.
	if err := os.WriteFile(path, []byte(`{"CurrentTerm":"AAAAAAAAAAk="}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err = OpenStable(path)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := s.GetUint64([]byte("CurrentTerm")); err != nil || v != 9 {
		t.Fatalf("term of an old file: %d %v", v, err)
	}
}

// FuzzOpen writes a log, overwrites some of its bytes, and opens it: the
// open fails with ErrCorrupt or gives a contiguous log whose every entry
// reads back, never a panic.
func FuzzOpen(f *testing.F) {
	f.Add(uint16(20), []byte{0xff})
	f.Add(uint16(300), []byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint16(2), []byte("TXMQWAL1"))
	f.Add(uint16(1000), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, at uint16, b []byte) {
		dir := t.TempDir()
		opts := Options{SegmentSize: 2 << 10}
		writeLog(t, dir, opts, 30, 4, 60)
		names := segmentFiles(t, dir)
		path := names[int(at)%len(names)]
		fh, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		fh.WriteAt(b, int64(at)%(2<<10))
		fh.Close()
		l, err := Open(dir, opts)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("open: %v, want ErrCorrupt or success", err)
			}
			return
		}
		defer l.Close()
		first, _ := l.FirstIndex()
		last, _ := l.LastIndex()
		for i := first; first != 0 && i <= last; i++ {
			var e raft.Log
			if err := l.GetLog(i, &e); err != nil || e.Index != i {
				t.Fatalf("entry %d of %d..%d: %v (index %d)", i, first, last, err, e.Index)
			}
		}
	})
}
