package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/hashicorp/raft"
)

// A record is one log entry, framed:
//
//	length   uint32  bytes of the payload
//	crc      uint32  CRC-32C of the payload, chained: it starts from the
//	                 previous record's crc (the segment's header for the
//	                 first), so a record left behind by an older write
//	                 never checks out after newer ones
//	payload:
//	  index      uint64
//	  term       uint64
//	  type       uint8
//	  appendedAt int64   Unix nanoseconds, 0 for the zero time
//	  dataLen    uint32
//	  data       dataLen bytes
//	  extensions the rest
//
// All integers are big-endian. A frame whose length and CRC are both zero
// is the end of a segment's records (the rest of a segment is zeros).
const (
	frameHeader  = 8
	payloadFixed = 8 + 8 + 1 + 8 + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errBadRecord: a frame that does not hold a record (a torn write, or
// damaged bytes).
var errBadRecord = errors.New("bad record")

// recordSize is the framed size of l.
func recordSize(l *raft.Log) int {
	return frameHeader + payloadFixed + len(l.Data) + len(l.Extensions)
}

// appendRecord appends l's frame to b, chained to prev; it returns the
// record's crc, the next one's prev.
func appendRecord(b []byte, l *raft.Log, prev uint32) ([]byte, uint32) {
	start := len(b)
	b = append(b, make([]byte, frameHeader+payloadFixed)...)
	p := b[start+frameHeader:]
	binary.BigEndian.PutUint64(p[0:], l.Index)
	binary.BigEndian.PutUint64(p[8:], l.Term)
	p[16] = byte(l.Type)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	binary.BigEndian.PutUint64(p[17:], uint64(at))
	binary.BigEndian.PutUint32(p[25:], uint32(len(l.Data)))
	b = append(b, l.Data...)
	b = append(b, l.Extensions...)
	payload := b[start+frameHeader:]
	binary.BigEndian.PutUint32(b[start:], uint32(len(payload)))
	crc := crc32.Update(prev, castagnoli, payload)
	binary.BigEndian.PutUint32(b[start+4:], crc)
	return b, crc
}

// frameLen reads a frame header: the payload's length and CRC. Both zero
// means the end of the records.
func frameLen(h []byte) (n, crc uint32) {
	return binary.BigEndian.Uint32(h), binary.BigEndian.Uint32(h[4:])
}

// decodePayload checks payload against crc, chained to prev, and decodes
// it into l. l's byte slices are copies.
func decodePayload(payload []byte, crc, prev uint32, l *raft.Log) error {
	if len(payload) < payloadFixed {
		return fmt.Errorf("%w: %d bytes, fewer than a record's fixed part", errBadRecord, len(payload))
	}
	if crc32.Update(prev, castagnoli, payload) != crc {
		return fmt.Errorf("%w: checksum mismatch", errBadRecord)
	}
	dataLen := int(binary.BigEndian.Uint32(payload[25:]))
	if dataLen > len(payload)-payloadFixed {
		return fmt.Errorf("%w: data length %d past the record's end", errBadRecord, dataLen)
	}
	l.Index = binary.BigEndian.Uint64(payload[0:])
	l.Term = binary.BigEndian.Uint64(payload[8:])
	l.Type = raft.LogType(payload[16])
	l.AppendedAt = time.Time{}
	if at := int64(binary.BigEndian.Uint64(payload[17:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	rest := payload[payloadFixed:]
	l.Data = cloneOrNil(rest[:dataLen])
	l.Extensions = cloneOrNil(rest[dataLen:])
	return nil
}

func cloneOrNil(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
