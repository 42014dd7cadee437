package raftlog

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/txmq/txmq/raftlog/wal"
)

// The Raft log's two stores, chosen by Config.LogStore.
const (
	// LogStoreWAL keeps the log in raft-wal/ (package wal: one fdatasync
	// per append) and the term and vote in raft-stable.
	LogStoreWAL = "wal"
	// LogStoreBolt keeps both in raft.db (raft-boltdb: a bbolt commit, two
	// fdatasyncs, per append). Kept for one release; a node started with
	// LogStoreWAL on a raft.db migrates it.
	LogStoreBolt = "bolt"
)

const (
	walDir     = "raft-wal"
	stableFile = "raft-stable"
	boltFile   = "raft.db"
)

// hashicorp/raft's stable store keys (unexported there).
var (
	keyCurrentTerm  = []byte("CurrentTerm")
	keyLastVoteTerm = []byte("LastVoteTerm")
	keyLastVoteCand = []byte("LastVoteCand")
)

// walBackend is the wal and its stable store.
type walBackend struct {
	*wal.Log
	*wal.Stable
}

// openLogBackend opens the log store cfg.LogStore names, migrating a
// raft.db to the wal first when that is what the directory holds.
func openLogBackend(cfg Config, logger *slog.Logger) (logBackend, error) {
	boltPath := filepath.Join(cfg.Dir, boltFile)
	walPath := filepath.Join(cfg.Dir, walDir)
	hasBolt, hasWAL := exists(boltPath), exists(walPath)
	switch cfg.LogStore {
	case LogStoreBolt:
		if hasWAL {
			return nil, fmt.Errorf("raftlog: this node's Raft log is in %s (log store %q); log store %q cannot read it: start with the wal store", walPath, LogStoreWAL, LogStoreBolt)
		}
		db, err := openBolt(boltPath)
		if err != nil {
			return nil, fmt.Errorf("raftlog: log store: %w", err)
		}
		return db, nil
	case LogStoreWAL:
		if hasBolt && !hasWAL {
			if err := migrateBolt(cfg.Dir, logger); err != nil {
				return nil, fmt.Errorf("raftlog: migrating %s to %s: %w", boltPath, walPath, err)
			}
		}
		return openWAL(cfg.Dir, logger)
	}
	return nil, fmt.Errorf("raftlog: unknown log store %q (%s or %s)", cfg.LogStore, LogStoreWAL, LogStoreBolt)
}

func openBolt(path string) (*raftboltdb.BoltStore, error) {
	return raftboltdb.New(raftboltdb.Options{
		Path: path,
		// As for fsm.db: the freelist is rebuilt on open instead of
		// written on every commit. raft.db stays fsynced on every write.
		BoltOptions: &bbolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType},
	})
}

func openWAL(dir string, logger *slog.Logger) (*walBackend, error) {
	log, err := wal.Open(filepath.Join(dir, walDir), wal.Options{Logger: logger})
	if err != nil {
		return nil, fmt.Errorf("raftlog: log store: %w", err)
	}
	stable, err := wal.OpenStable(filepath.Join(dir, stableFile))
	if err != nil {
		log.Close()
		return nil, fmt.Errorf("raftlog: stable store: %w", err)
	}
	return &walBackend{Log: log, Stable: stable}, nil
}

// migrateBolt copies raft.db's entries and term and vote into a new wal,
// built beside it and renamed into place once complete, then renames
// raft.db to raft.db.migrated. A crash half-way leaves raft.db as it was
// and a partial raft-wal.migrating, which the next attempt starts over.
func migrateBolt(dir string, logger *slog.Logger) error {
	start := time.Now()
	tmp := filepath.Join(dir, walDir+".migrating")
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	db, err := openBolt(filepath.Join(dir, boltFile))
	if err != nil {
		return err
	}
	defer db.Close()
	log, err := wal.Open(tmp, wal.Options{Logger: logger})
	if err != nil {
		return err
	}
	n, err := copyEntries(db, log)
	if cerr := log.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := copyStable(db, filepath.Join(dir, stableFile)); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, walDir)); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(dir, boltFile), filepath.Join(dir, boltFile+".migrated")); err != nil {
		return err
	}
	logger.Info("Raft log migrated from raft-boltdb to the wal; raft.db kept as raft.db.migrated, delete it once the node runs well",
		"entries", n, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

func copyEntries(from raft.LogStore, to raft.LogStore) (int, error) {
	first, err := from.FirstIndex()
	if err != nil {
		return 0, err
	}
	last, err := from.LastIndex()
	if err != nil || first == 0 {
		return 0, err
	}
	const batch = 1024
	n := 0
	for i := first; i <= last; i += batch {
		var logs []*raft.Log
		for j := i; j < i+batch && j <= last; j++ {
			l := new(raft.Log)
			if err := from.GetLog(j, l); err != nil {
				return n, fmt.Errorf("entry %d: %w", j, err)
			}
			logs = append(logs, l)
		}
		if err := to.StoreLogs(logs); err != nil {
			return n, err
		}
		n += len(logs)
	}
	return n, nil
}

func copyStable(from raft.StableStore, path string) error {
	to, err := wal.OpenStable(path)
	if err != nil {
		return err
	}
	for _, k := range [][]byte{keyCurrentTerm, keyLastVoteTerm} {
		v, err := from.GetUint64(k)
		if err != nil && err.Error() != "not found" {
			return err
		}
		if err == nil {
			if err := to.SetUint64(k, v); err != nil {
				return err
			}
		}
	}
	v, err := from.Get(keyLastVoteCand)
	if err != nil && err.Error() != "not found" {
		return err
	}
	if err == nil {
		return to.Set(keyLastVoteCand, v)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
