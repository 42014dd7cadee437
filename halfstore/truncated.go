package halfstore

import (
	"encoding/binary"
	"hash/fnv"
	"io"
	"os"
)

// bbolt's meta page, as it is on disk (little-endian on every platform Go
// runs bbolt on here): a 16-byte page header, then magic, version, page
// size, flags, the root bucket (16 bytes), the freelist page, the high-water
// page ID, the transaction ID and an FNV-64a checksum of what precedes it.
const (
	metaMagic      = 0xED0CDAED
	metaOff        = 16
	metaPageSize   = metaOff + 8
	metaHighWater  = metaOff + 40
	metaTxID       = metaOff + 48
	metaChecksum   = metaOff + 56
	metaHeaderSize = metaOff + 64
)

// truncatedStore reports whether the bbolt file at path is shorter than its
// newest valid meta page says it is: a file cut short (a bad copy, a full
// disk, a crash of a file system that lost its tail). bbolt would read the
// missing pages through its mmap and die of SIGBUS when it rebuilds its
// free list on open. A missing file, or one without a valid meta page, is
// not reported: bbolt creates the one and refuses the other itself.
func truncatedStore(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false
	}
	// The two meta pages are pages 0 and 1; each says the page size.
	read := func(off int64) (meta, bool) {
		buf := make([]byte, metaHeaderSize)
		if _, err := f.ReadAt(buf, off); err != nil && err != io.EOF {
			return meta{}, false
		}
		return parseMeta(buf)
	}
	m0, ok0 := read(0)
	pageSize := int64(os.Getpagesize())
	if ok0 {
		pageSize = int64(m0.pageSize)
	}
	m1, ok1 := read(pageSize)
	newest := m0
	switch {
	case ok1 && (!ok0 || m1.txid > m0.txid):
		newest = m1
	case !ok0:
		return false
	}
	return uint64(fi.Size()) < newest.highWater*uint64(newest.pageSize)
}

type meta struct {
	txid, highWater uint64
	pageSize        uint32
}

// parseMeta reads a meta page's transaction ID, page size and high-water
// page ID, if its magic and checksum are right.
func parseMeta(b []byte) (meta, bool) {
	le := binary.LittleEndian
	if le.Uint32(b[metaOff:]) != metaMagic {
		return meta{}, false
	}
	h := fnv.New64a()
	h.Write(b[metaOff:metaChecksum])
	if h.Sum64() != le.Uint64(b[metaChecksum:]) {
		return meta{}, false
	}
	return meta{txid: le.Uint64(b[metaTxID:]), highWater: le.Uint64(b[metaHighWater:]), pageSize: le.Uint32(b[metaPageSize:])}, true
}
