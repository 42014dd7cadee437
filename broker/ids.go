package broker

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"
)

// idGen makes message IDs: 8 bytes of the leader's clock in milliseconds
// and 8 random bytes, hex encoded. IDs sort roughly by creation time, which
// keeps listings in a useful order; uniqueness comes from the random part
// (the FSM also refuses a reused ID).
type idGen struct {
	mu  sync.Mutex
	buf [16]byte
}

func newIDGen() *idGen { return &idGen{} }

func (g *idGen) next(now time.Time) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	binary.BigEndian.PutUint64(g.buf[:8], uint64(now.UnixMilli()))
	_, _ = rand.Read(g.buf[8:])
	return hex.EncodeToString(g.buf[:])
}

// idTime reads the leader's clock out of a message ID.
func idTime(id string) (time.Time, bool) {
	ms, ok := idMillis([]byte(id))
	if !ok {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// idMillis reads the leader's clock out of a message ID in milliseconds,
// without allocating: a scrape of the metrics reads it from every pending
// message's key.
func idMillis(id []byte) (int64, bool) {
	if len(id) != 32 {
		return 0, false
	}
	var raw [8]byte
	if _, err := hex.Decode(raw[:], id[:16]); err != nil {
		return 0, false
	}
	return int64(binary.BigEndian.Uint64(raw[:])), true
}
