package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/internal/diskio"
)

// A segment is one file of consecutive records, named by the index of its
// first record, beginning with a header (magic, first index).
const (
	segmentSuffix = ".wal"
	segmentHeader = 16
)

var segmentMagic = []byte("TXMQWAL1")

// ErrCorrupt: a segment holds bytes that are not a record where records
// must be (a sealed segment, or a header), so the log cannot be trusted.
var ErrCorrupt = errors.New("wal: corrupt log")

type segment struct {
	base    uint64 // index of the first record
	f       *os.File
	path    string
	offsets []int64  // offsets[i]: where the record of index base+i starts
	crcs    []uint32 // crcs[i]: that record's chained crc
	seed    uint32   // the chain's start: the header's crc
	tail    int64    // where the next record goes
	size    int64    // bytes reserved for the file
	// zeroed: the file is written (records or zeros) up to here, or to
	// the tail if that is further; wmu (zero.go).
	zeroed int64
}

// prev is the crc the record of index (base+i) is chained to.
func (s *segment) prev(i uint64) uint32 {
	if i == 0 {
		return s.seed
	}
	return s.crcs[i-1]
}

// last is the index of the segment's last record, base-1 when it has none.
func (s *segment) last() uint64 { return s.base + uint64(len(s.offsets)) - 1 }

// errUnwrittenSegment: a segment whose header and first records are all
// zeros: its creation never finished.
var errUnwrittenSegment = errors.New("wal: segment never written")

func segmentPath(dir string, base uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d%s", base, segmentSuffix))
}

// segmentBases lists the first indexes of the segments in dir, in order.
func segmentBases(dir string) ([]uint64, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*"+segmentSuffix))
	if err != nil {
		return nil, err
	}
	var bases []uint64
	for _, name := range names {
		base, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(name), segmentSuffix), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%w: %s is not a segment's name", ErrCorrupt, name)
		}
		bases = append(bases, base)
	}
	// Names are zero-padded to the same width: Glob's order is numeric.
	return bases, nil
}

// createSegment makes a new, empty segment of size bytes reserved, durable
// (file and directory synced) before it is used.
func createSegment(dir string, base uint64, size int64) (*segment, error) {
	path := segmentPath(dir, base)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	err = preallocate(f, size)
	h := make([]byte, segmentHeader)
	copy(h, segmentMagic)
	binary.BigEndian.PutUint64(h[8:], base)
	seed := crc32.Checksum(h, castagnoli)
	if err == nil {
		_, err = f.WriteAt(h, 0)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = diskio.SyncDir(dir)
	}
	if err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return &segment{base: base, f: f, path: path, tail: segmentHeader, size: size, seed: seed}, nil
}

// openSegment opens the segment of index base and reads where its records
// are. In the last segment (last), the first frame that is not a record
// ends the log: it and everything after it are a write that was never
// synced, and are zeroed. Anywhere else such a frame is corruption, and so
// it is in the last segment when it cannot be a torn write (see torn).
func openSegment(dir string, base uint64, last bool, opts Options) (*segment, error) {
	path := segmentPath(dir, base)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	s := &segment{base: base, f: f, path: path, tail: segmentHeader}
	if err := s.scan(last, opts); err != nil {
		f.Close()
		return nil, err
	}
	return s, nil
}

func (s *segment) scan(last bool, opts Options) error {
	st, err := s.f.Stat()
	if err != nil {
		return err
	}
	s.size = st.Size()
	h := make([]byte, 1<<16)
	n, err := s.f.ReadAt(h, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if h = h[:n]; allZero(h) {
		return errUnwrittenSegment
	}
	if len(h) < segmentHeader || !bytes.Equal(h[:8], segmentMagic) || binary.BigEndian.Uint64(h[8:]) != s.base {
		return fmt.Errorf("%w: %s: bad segment header", ErrCorrupt, s.path)
	}
	h = h[:segmentHeader]
	s.seed = crc32.Checksum(h, castagnoli)
	r := io.NewSectionReader(s.f, 0, s.size)
	var l raft.Log
	for {
		i := uint64(len(s.offsets))
		n, crc, err := s.readAt(r, s.tail, s.prev(i), &l)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err == nil && l.Index != s.base+i {
			err = fmt.Errorf("%w: index %d where %d belongs", errBadRecord, l.Index, s.base+i)
		}
		if err == nil {
			s.offsets = append(s.offsets, s.tail)
			s.crcs = append(s.crcs, crc)
			s.tail += n
			continue
		}
		if last {
			err = s.torn(r, err, opts.MaxBatch)
		}
		if !last || !errors.Is(err, errBadRecord) {
			return fmt.Errorf("%w: %s at offset %d: %w", ErrCorrupt, s.path, s.tail, err)
		}
		opts.Logger.Warn("wal: the log's last write never finished its sync (a crash during an append); dropping it: nothing in it was acknowledged",
			"file", s.path, "offset", s.tail, "entries_kept", len(s.offsets), "reason", err.Error())
		return s.zeroFrom(s.tail)
	}
}

// Why a bad frame in the last segment is not a torn write.
var (
	errPastEnd   = errors.New("the file was cut short")
	errDataAfter = errors.New("a damaged record followed by records that check out")
)

// pastEnd is the error of a frame that runs past the end of the file: a
// file cut short (errPastEnd) when it ends with data (within its last 64
// bytes after from), else otherwise. A segment has its full size before
// any record is written (preallocate), and the space no record reached is
// zeros: only a file cut short ends in the middle of a record.
func (s *segment) pastEnd(r io.ReaderAt, from int64, otherwise error) error {
	const probe = 64
	b := make([]byte, min(probe, s.size-from))
	if _, err := r.ReadAt(b, s.size-int64(len(b))); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if allZero(b) {
		return otherwise
	}
	return fmt.Errorf("%w: the segment is %d bytes and ends inside a record", errPastEnd, s.size)
}

// torn says whether bad, the error of the frame at the tail of the last
// segment, may be a write that never finished its sync (then it returns
// bad, an errBadRecord) or is damage: a file cut short (see pastEnd), or a
// record followed by at least
// maxBatch records that check out, chained to it (one append writes at
// most maxBatch records, so some of those were written by a later append,
// whose sync succeeded: the damaged record was durable, and then changed).
func (s *segment) torn(r io.ReaderAt, bad error, maxBatch int) error {
	if errors.Is(bad, errPastEnd) {
		return bad
	}
	var h [frameHeader]byte
	if _, err := r.ReadAt(h[:], s.tail); err != nil {
		return bad
	}
	n, prev := frameLen(h[:])
	off := s.tail + frameHeader + int64(n)
	var l raft.Log
	want := s.base + uint64(len(s.offsets)) + 1
	good := 0
	for good < maxBatch {
		k, crc, err := s.readAt(r, off, prev, &l)
		if err != nil || l.Index != want {
			return bad
		}
		off, prev, want, good = off+k, crc, want+1, good+1
	}
	return fmt.Errorf("%w (%d of them): not a torn write", errDataAfter, good)
}

// readAt reads the record at off, chained to prev, into l and returns its
// framed size and crc; io.EOF at the end of the records.
func (s *segment) readAt(r io.ReaderAt, off int64, prev uint32, l *raft.Log) (int64, uint32, error) {
	var h [frameHeader]byte
	if off >= s.size {
		// A segment filled to its last byte.
		return 0, 0, io.EOF
	}
	if off+frameHeader > s.size {
		// The slack at the end of a full segment is zeros.
		return 0, 0, s.pastEnd(r, off, io.EOF)
	}
	if _, err := r.ReadAt(h[:], off); err != nil {
		return 0, 0, err
	}
	n, crc := frameLen(h[:])
	if n == 0 && crc == 0 {
		return 0, 0, io.EOF
	}
	if off+frameHeader+int64(n) > s.size {
		return 0, 0, s.pastEnd(r, off+frameHeader, fmt.Errorf("%w: a frame of %d bytes at offset %d runs past the end of the segment", errBadRecord, n, off))
	}
	payload := make([]byte, n)
	if _, err := r.ReadAt(payload, off+frameHeader); err != nil {
		return 0, 0, err
	}
	if err := decodePayload(payload, crc, prev, l); err != nil {
		return 0, 0, err
	}
	return frameHeader + int64(n), crc, nil
}

// zeroFrom zeroes the segment from off on, up to the first chunk that is
// zero already (the part never written), from the end backwards, then
// syncs. Backwards, so that a crash half-way leaves the records that come
// first (the truncation not yet done, which Raft repeats), never old
// records behind new ones.
func (s *segment) zeroFrom(off int64) error {
	const chunk = 1 << 20
	end := off
	buf := make([]byte, chunk)
	for end < s.size {
		n := min(chunk, s.size-end)
		if _, err := s.f.ReadAt(buf[:n], end); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if allZero(buf[:n]) {
			break
		}
		end += n
	}
	clear(buf)
	for end > off {
		start := max(off, end-chunk)
		if _, err := s.f.WriteAt(buf[:end-start], start); err != nil {
			return err
		}
		end = start
	}
	s.tail = off
	return datasync(s.f)
}

// unwrite zeroes the n bytes after the tail that a failed append may have
// left (part of a write, or a write whose sync failed), best effort: the
// next append overwrites them, but if it goes to a new segment instead,
// they would stay behind this segment's last record, where a restart would
// take them for corruption. A full disk still takes writes over space
// already allocated.
func (s *segment) unwrite(n int) {
	_, _ = s.f.WriteAt(make([]byte, n), s.tail)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// truncate drops the records from index on (index within the segment).
func (s *segment) truncate(index uint64) error {
	i := index - s.base
	if err := s.zeroFrom(s.offsets[i]); err != nil {
		return err
	}
	s.offsets, s.crcs = s.offsets[:i], s.crcs[:i]
	return nil
}

func (s *segment) remove() error {
	s.f.Close()
	return os.Remove(s.path)
}
