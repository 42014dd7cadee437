// Package raftlog is the Raft node of a txmq broker: hashicorp/raft with its
// log in a segmented store of our own (package wal; raft-boltdb for one more
// release), file snapshots, a TCP transport (with a correction of the commit
// index followers hear, commitclamp.go), the state machine that applies
// commands to the halfstore, and the encoding of those commands (package
// raftpb).
//
// Proposals are group-committed: hashicorp/raft gathers every proposal that
// is waiting when the leader loop runs (up to MaxAppendEntries) into one log
// write (one fdatasync), and hands the committed batch to the
// FSM, which applies it in one bbolt transaction of the store. The store is
// not fsynced per batch: the log and the snapshots rebuild it, and a store
// that a power cut may have torn is discarded on start
// (halfstore.OpenUnsynced).
package raftlog

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/halfstore"
)

// Node is one member of the Raft cluster and the owner of its store.
type Node struct {
	cfg       Config
	raft      *raft.Raft
	fsm       *fsm
	store     *halfstore.Store
	logStore  *logStore
	transport *commitClamp

	// closing gates proposals against Close: hashicorp/raft never answers a
	// proposal still queued when it shuts down, so Propose must not queue
	// one after Close began, and must stop waiting when it does.
	closing  sync.RWMutex
	closed   bool
	shutdown chan struct{}
	// syncDone is closed when syncStore has returned, logSyncDone when
	// the log store's syncBehind has.
	syncDone    chan struct{}
	logSyncDone chan struct{}
	// batcher merges concurrent proposals into one log entry.
	batcher *batcher
	// commitDone is closed when the FSM's committer has returned.
	commitDone chan struct{}
}

// Open starts a node. If the store is behind the newest snapshot on disk
// (a crash between snapshot install and store swap, or a copied data dir),
// the store is restored from it first; otherwise the store is used as it
// is and Raft replays only the entries after its applied index.
func Open(cfg Config) (*Node, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	logger := cfg.Logger.With("component", "raft", "node", cfg.NodeID)
	hlog := newHCLogger(logger)

	n := &Node{cfg: cfg, shutdown: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			n.closeFiles()
			// Once the transport exists, closing it closed the listener.
			if n.transport == nil && cfg.Listener != nil {
				cfg.Listener.Close()
			}
		}
	}()
	snaps, err := n.openStores(logger, hlog)
	if err != nil {
		return nil, err
	}
	layer, err := streamLayer(cfg, logger)
	if err != nil {
		return nil, err
	}
	n.transport = newCommitClamp(newTransport(layer, hlog), n.logStore)
	n.fsm = newFSM(n.store, logger, cfg.OnApply, cfg.Hooks, n.shutdown, n.handOver)
	n.fsm.logged = n.logStore.waitDurable
	if err := n.fsm.loadStamp(); err != nil {
		return nil, fmt.Errorf("raftlog: %w", err)
	}
	// Replication reads the entries it sends from the log; the newest are
	// served from memory instead of a bbolt read and decode each.
	logs, err := raft.NewLogCache(logCacheSize, n.logStore)
	if err != nil {
		return nil, fmt.Errorf("raftlog: log cache: %w", err)
	}
	if n.raft, err = raft.NewRaft(raftConfig(cfg, hlog), n.fsm, logs, n.logStore, snaps, n.transport); err != nil {
		return nil, fmt.Errorf("raftlog: start raft: %w", err)
	}
	n.logStore.raft.Store(n.raft)
	if cfg.Bootstrap {
		if err := n.bootstrap(snaps, logger); err != nil {
			n.raft.Shutdown()
			return nil, err
		}
	}
	n.batcher = newBatcher(n)
	n.syncDone = make(chan struct{})
	go n.syncStore(logger)
	// A deferred append before this waits in kick.
	n.logSyncDone = make(chan struct{})
	go func() {
		defer close(n.logSyncDone)
		n.logStore.syncBehind()
	}()
	n.commitDone = make(chan struct{})
	go func() {
		defer close(n.commitDone)
		n.fsm.commitBehind()
	}()
	ok = true
	return n, nil
}

// openStores opens the state machine's store (restored from the newest
// snapshot when behind it), the snapshot store and the log store.
func (n *Node) openStores(logger *slog.Logger, hlog hclog.Logger) (raft.SnapshotStore, error) {
	cfg := n.cfg
	// The store is not fsynced per batch: the Raft log and snapshots
	// rebuild it, and a store a power cut may have torn is discarded, not
	// opened (halfstore.OpenUnsynced, docs/decisions.md).
	store, how, err := halfstore.OpenUnsynced(filepath.Join(cfg.Dir, "fsm.db"), cfg.BootIDFile)
	if err != nil {
		return nil, err
	}
	n.store = store
	switch {
	case how.Truncated:
		logger.Warn("fsm.db is shorter than its bbolt meta page says (cut short); discarded, rebuilding it from the snapshot and the Raft log")
	case how.Discarded:
		logger.Warn("fsm.db was left unsynced by an earlier boot (power cut or OS crash); discarded, rebuilding it from the snapshot and the Raft log")
	case how.Synced:
		logger.Info("the boot ID cannot be read here; fsm.db is fsynced on every batch")
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(cfg.Dir, cfg.SnapshotRetain, hlog)
	if err != nil {
		return nil, fmt.Errorf("raftlog: snapshot store: %w", err)
	}
	if err := catchUpFromSnapshot(n.store, snaps, logger); err != nil {
		return nil, err
	}
	db, err := openLogBackend(cfg, logger)
	if err != nil {
		return nil, err
	}
	n.logStore = &logStore{db: db, stored: cfg.Hooks.LogStored, stop: n.shutdown, logger: logger,
		kick: make(chan struct{}, 1), synced: cfg.Hooks.LogSynced}
	if d, ok := db.(deferredLog); ok && !cfg.SyncLeaderAppend {
		n.logStore.deferred = d
	}
	return snaps, nil
}

// raftConfig is hashicorp/raft's configuration for cfg.
func raftConfig(cfg Config, hlog hclog.Logger) *raft.Config {
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hlog
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.CommitTimeout = cfg.CommitTimeout
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.TrailingLogs = cfg.TrailingLogs
	rc.MaxAppendEntries = cfg.MaxAppendEntries
	// BatchApplyCh stays off: with a buffered apply channel, proposals
	// queued when Raft shuts down are never answered. Group commit works
	// without it: the leader loop takes every proposal already waiting.
	// The store keeps its own applied index: on start it is already at or
	// past the newest snapshot (see catchUpFromSnapshot), so loading the
	// snapshot again would only cost time.
	rc.NoSnapshotRestoreOnStart = true
	return rc
}

// bootstrap starts a new cluster, of this node or of cfg.Peers, unless
// Raft state exists already.
func (n *Node) bootstrap(snaps raft.SnapshotStore, logger *slog.Logger) error {
	has, err := raft.HasExistingState(n.logStore, n.logStore, snaps)
	if err != nil {
		return fmt.Errorf("raftlog: %w", err)
	}
	if has {
		return nil
	}
	servers := []raft.Server{{ID: raft.ServerID(n.cfg.NodeID), Address: n.transport.LocalAddr(), Suffrage: raft.Voter}}
	if len(n.cfg.Peers) > 0 {
		servers = nil
		for _, p := range n.cfg.Peers {
			servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
		}
	}
	if err := n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error(); err != nil {
		return fmt.Errorf("raftlog: bootstrap: %w", err)
	}
	logger.Info("bootstrapped a new cluster", "raft_addr", string(n.transport.LocalAddr()))
	return nil
}

// logCacheSize is how many of the newest log entries are kept in memory
// for replication (a few MaxAppendEntries batches).
const logCacheSize = 1024

// storeSyncInterval is how often the unsynced store is fsynced. Nothing
// relies on it for durability (the Raft log is the truth); it bounds how
// long a failing disk goes unnoticed and how much the kernel holds dirty.
const storeSyncInterval = time.Second

// syncStore fsyncs the store every storeSyncInterval until the node
// closes. A failed fsync stops the node, as a failed commit always did:
// the kernel may drop pages it could not write, so the store cannot be
// trusted any more (Sync marked it to be rebuilt on the next start).
func (n *Node) syncStore(logger *slog.Logger) {
	defer close(n.syncDone)
	t := time.NewTicker(storeSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
		}
		if err := n.store.Sync(); err != nil && !errors.Is(err, halfstore.ErrClosed) {
			logger.Error("cannot fsync the store", "err", err)
			panic(fmt.Sprintf("raftlog: %v", err))
		}
	}
}

// catchUpFromSnapshot restores the store from the newest snapshot when the
// store is behind it. Raft will replay only entries after the snapshot.
func catchUpFromSnapshot(store *halfstore.Store, snaps raft.SnapshotStore, logger *slog.Logger) error {
	list, err := snaps.List()
	if err != nil {
		return fmt.Errorf("raftlog: list snapshots: %w", err)
	}
	if len(list) == 0 {
		return nil
	}
	applied, err := store.AppliedIndex()
	if err != nil {
		return err
	}
	newest := list[0]
	if applied >= newest.Index {
		return nil
	}
	_, rc, err := snaps.Open(newest.ID)
	if err != nil {
		return fmt.Errorf("raftlog: open snapshot %s: %w", newest.ID, err)
	}
	defer rc.Close()
	if err := store.Restore(rc); err != nil {
		return fmt.Errorf("raftlog: restore snapshot %s: %w", newest.ID, err)
	}
	logger.Info("store was behind the newest snapshot; restored", "store_index", applied, "snapshot_index", newest.Index)
	return nil
}

// Store is the node's halfstore, for reads. Writes go through Propose.
func (n *Node) Store() *halfstore.Store { return n.store }

// ID is this node's Raft server ID.
func (n *Node) ID() string { return n.cfg.NodeID }

// RaftAddr is the address other nodes reach this node's Raft transport at.
func (n *Node) RaftAddr() string { return string(n.transport.LocalAddr()) }

// IsLeader reports whether this node believes it is the leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// Leader returns the current leader's ID and Raft address, empty if unknown.
func (n *Node) Leader() (id, raftAddr string) {
	addr, sid := n.raft.LeaderWithID()
	return string(sid), string(addr)
}

// LeaderCh delivers true when this node becomes leader and false when it
// stops being leader. Only the latest value is kept; one reader only.
func (n *Node) LeaderCh() <-chan bool { return n.raft.LeaderCh() }

// AppliedByFSM counts the entries this node's FSM applied to the store since
// it opened (entries skipped because the store already had them excluded).
func (n *Node) AppliedByFSM() uint64 { return n.fsm.applied.Load() }

// LatestStamp is the latest time stamped into a command this node
// applied (the zero time before the first): a leader stamps no earlier.
func (n *Node) LatestStamp() time.Time {
	ns := n.fsm.stamp.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// AppliedBatches counts the store commits that carried those entries.
func (n *Node) AppliedBatches() uint64 { return n.fsm.w.Commits() }

// handOver asks Raft to move leadership to another voter, if this node
// leads: its store cannot commit (the disk is full), so it can serve no
// writes. It does not wait for the transfer.
func (n *Node) handOver() {
	if n.IsLeader() {
		n.raft.LeadershipTransfer()
	}
}

// storageError says that this node cannot write to its disk (err matches
// diskio.ErrWrite).
func (n *Node) storageError(err error) error {
	return fmt.Errorf("raftlog: node %s: %w", n.cfg.NodeID, err)
}

func (n *Node) notLeader() error {
	id, addr := n.Leader()
	return &NotLeaderError{LeaderID: id, LeaderRaftAddr: addr}
}

// Barrier waits until every entry committed before the call is applied to
// the store. A new leader calls it before it reads the store to serve.
func (n *Node) Barrier(ctx context.Context) error {
	timeout := n.cfg.ProposeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	err := n.raft.Barrier(timeout).Error()
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return n.notLeader()
	}
	return err
}

// VerifyLeader confirms with a majority that this node is still the
// leader: a read served after it is linearizable.
func (n *Node) VerifyLeader() error {
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return n.notLeader()
	}
	return nil
}

// WaitLeader blocks until the cluster has a leader or ctx ends.
func (n *Node) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if id, _ := n.Leader(); id != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("raftlog: no leader: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// HoldLogSyncs makes the sync behind each of the leader's appends call hold
// first, which may block to hold the fsync back. For tests of what waits
// for it; nil removes it.
func (n *Node) HoldLogSyncs(hold func()) {
	if hold == nil {
		n.logStore.hold.Store(nil)
		return
	}
	n.logStore.hold.Store(&hold)
}

// Close stops Raft and closes the log and the store. Everything
// acknowledged is already on disk; Close loses nothing.
func (n *Node) Close() error {
	n.closing.Lock()
	if n.closed {
		n.closing.Unlock()
		return nil
	}
	n.closed = true
	close(n.shutdown)
	n.closing.Unlock()
	var errs []error
	if n.raft != nil {
		errs = append(errs, n.raft.Shutdown().Error())
	}
	if n.syncDone != nil {
		<-n.syncDone
	}
	if n.logSyncDone != nil {
		<-n.logSyncDone
	}
	if n.batcher != nil {
		<-n.batcher.done
	}
	if n.commitDone != nil {
		// Raft has stopped applying: commit what it applied last. If that
		// fails, the store is behind the log, which a restart replays.
		<-n.commitDone
		errs = append(errs, n.fsm.commit())
	}
	errs = append(errs, n.closeFiles())
	return errors.Join(errs...)
}

func (n *Node) closeFiles() error {
	var errs []error
	if n.transport != nil {
		errs = append(errs, n.transport.Close())
	}
	if n.logStore != nil {
		errs = append(errs, n.logStore.Close())
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	return errors.Join(errs...)
}
