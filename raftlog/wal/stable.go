package wal

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	if err := json.Unmarshal(b, &s.kv); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	return s, nil
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
	b, err := json.Marshal(s.kv)
	if err != nil {
		return err
	}
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
