package wal

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/internal/diskio"
)

// errNotFound is what hashicorp/raft expects of a stable store for a key
// never set: it compares the text.
var errNotFound = errors.New("not found")

// Stable is hashicorp/raft's stable store (the current term, the last
// vote) in one small file, rewritten whole on every change: written to a
// temporary file, synced, renamed over the old one, directory synced.
// Changes are rare (a new term, a vote), reads come from memory.
//
// The file is a header line, stableMagic and the CRC-32C of the rest in
// hex, then the values as JSON: a changed byte anywhere is ErrCorrupt,
// not a forgotten term or vote (a node that forgot its vote could vote
// twice in a term). A file without the header (written before it existed)
// starts with '{' and is read as it is.
type Stable struct {
	path string
	mu   sync.Mutex
	kv   map[string][]byte
}

var _ raft.StableStore = (*Stable)(nil)

// OpenStable opens the stable store at path, empty if the file does not
// exist.
func OpenStable(path string) (*Stable, error) {
	s := &Stable{path: path, kv: map[string][]byte{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, err
	}
	body, err := checkStable(b)
	if err == nil {
		err = json.Unmarshal(body, &s.kv)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return s, nil
}

// stableMagic begins the stable store's header line.
const stableMagic = "TXMQSTABLE1 "

// checkStable checks the file's header and returns its JSON.
func checkStable(b []byte) ([]byte, error) {
	if len(b) > 0 && b[0] == '{' {
		return b, nil
	}
	line, body, ok := bytes.Cut(b, []byte("\n"))
	hex, found := bytes.CutPrefix(line, []byte(stableMagic))
	if !ok || !found {
		return nil, errors.New("no stable store header")
	}
	want, err := strconv.ParseUint(string(hex), 16, 32)
	if err != nil {
		return nil, fmt.Errorf("bad checksum %q in the header", hex)
	}
	if crc32.Checksum(body, castagnoli) != uint32(want) {
		return nil, errors.New("checksum mismatch")
	}
	return body, nil
}

// Set stores val under key, durably.
func (s *Stable) Set(key, val []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.kv[string(key)]
	s.kv[string(key)] = append([]byte(nil), val...)
	if err := s.write(); err != nil {
		if had {
			s.kv[string(key)] = old
		} else {
			delete(s.kv, string(key))
		}
		return err
	}
	return nil
}

// Get is the value of key, errNotFound if it was never set.
func (s *Stable) Get(key []byte) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.kv[string(key)]
	if !ok {
		return nil, errNotFound
	}
	return append([]byte(nil), v...), nil
}

// SetUint64 stores val under key, durably.
func (s *Stable) SetUint64(key []byte, val uint64) error {
	return s.Set(key, binary.BigEndian.AppendUint64(nil, val))
}

// GetUint64 is the value of key, errNotFound if it was never set.
func (s *Stable) GetUint64(key []byte) (uint64, error) {
	v, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: %s: %q holds %d bytes, not a uint64", ErrCorrupt, s.path, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

func (s *Stable) write() error {
	body, err := json.Marshal(s.kv)
	if err != nil {
		return err
	}
	b := fmt.Appendf(nil, "%s%08x\n%s", stableMagic, crc32.Checksum(body, castagnoli), body)
	tmp := s.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return diskio.WriteFailed("wal: write "+s.path, err)
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, s.path)
	}
	if err == nil {
		err = diskio.SyncDir(filepath.Dir(s.path))
	}
	if err != nil {
		return diskio.WriteFailed("wal: write "+s.path, err)
	}
	return nil
}
