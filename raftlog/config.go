package raftlog

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"time"

	"github.com/hashicorp/raft"
)

// Config configures a node. Defaults fills the zero fields.
type Config struct {
	// NodeID is this node's Raft server ID, unique in the cluster.
	NodeID string
	// Dir holds fsm.db (the halfstore), the Raft log (raft-wal/ and
	// raft-stable, or raft.db: LogStore) and snapshots/.
	Dir string
	// LogStore is the Raft log's store: LogStoreWAL (the default) or
	// LogStoreBolt.
	LogStore string
	// SyncLeaderAppend makes the leader fsync each append before Raft
	// replicates it (hashicorp/raft's own order, and always so with
	// LogStoreBolt). By default the wal's leader syncs behind its
	// appends, while they replicate; nothing is applied or made known as
	// committed before they are durable here (docs/decisions.md).
	SyncLeaderAppend bool
	// BootIDFile, testing only: where the machine's boot ID is read (""
	// is the kernel's), which tells an unclean reboot from a process
	// crash (halfstore.OpenUnsynced).
	BootIDFile string
	// RaftAddr is the address the Raft transport listens on, unless
	// Listener or StreamLayer is set.
	RaftAddr string
	// Listener, when set, is the listener the TCP transport accepts on
	// instead of one opened on RaftAddr: tests hand over one bound to
	// 127.0.0.1:0, so that no port is chosen twice. Open takes it over:
	// the node closes it, also when Open fails.
	Listener net.Listener
	// AdvertiseAddr is the address other nodes reach this one at; defaults
	// to the address the transport is bound to.
	AdvertiseAddr string
	// Bootstrap makes a brand-new node (no Raft state on disk) start a
	// cluster: with itself as the only voter, or with Peers when set.
	// Ignored when state exists.
	Bootstrap bool
	// Peers is the static membership every node of a new cluster is
	// started with (--peers); it must include this node.
	Peers []Peer
	// StreamLayer replaces the TCP transport's listener and dialer: tests
	// wrap it to drop or delay links. RaftAddr and Listener are then
	// unused.
	StreamLayer raft.StreamLayer
	// PeerTLS, when set, is mutual TLS between nodes on top of the
	// transport's listener and dialer (or StreamLayer): the configuration
	// of both ends (tlsconf.Source.PeerConfig).
	PeerTLS *tls.Config

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	// SnapshotInterval and SnapshotThreshold: a snapshot is taken when at
	// least SnapshotThreshold entries were added since the last one,
	// checked every SnapshotInterval.
	SnapshotInterval  time.Duration
	SnapshotThreshold uint64
	// TrailingLogs entries are kept after a snapshot, so that a follower a
	// little behind catches up from the log instead of a snapshot.
	TrailingLogs uint64
	// SnapshotRetain is how many snapshots are kept on disk.
	SnapshotRetain int
	// MaxAppendEntries bounds a group commit (and an append RPC).
	MaxAppendEntries int
	// Linger is how long a proposal made with MayWait may wait for another
	// write to share its log entry, when writes came within that time
	// (batcher.go).
	Linger time.Duration
	// Regroup is how long after their answers the batcher may wait,
	// before it takes the next entry, for the writers the last entry
	// answered to write again (batcher.go); negative: it never waits.
	Regroup time.Duration
	// ProposeTimeout bounds a proposal when ctx has no deadline.
	ProposeTimeout time.Duration

	Logger *slog.Logger
	// OnApply is called after each applied batch that changed something
	// worth waking for. It runs on the FSM goroutine: it must not block.
	OnApply func([]Event)
	// Hooks hear of log writes, applied batches and snapshots, for metrics.
	Hooks Hooks
}

// DefaultLinger is Config.Linger's default.
const DefaultLinger = 2 * time.Millisecond

// DefaultRegroup is Config.Regroup's default: longer than writers under
// load take to come back (docs/decisions.md).
const DefaultRegroup = 3 * time.Millisecond

// Snapshot defaults, used by Config.Defaults and cmd/broker's flags alike.
const (
	DefaultSnapshotInterval  = 2 * time.Minute
	DefaultSnapshotThreshold = 8192
)

// Defaults returns cfg with every zero field set to its default.
func (cfg Config) Defaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.HeartbeatTimeout, time.Second)
	def(&cfg.ElectionTimeout, time.Second)
	def(&cfg.LeaderLeaseTimeout, 500*time.Millisecond)
	def(&cfg.CommitTimeout, 50*time.Millisecond)
	def(&cfg.SnapshotInterval, DefaultSnapshotInterval)
	def(&cfg.ProposeTimeout, 10*time.Second)
	def(&cfg.Linger, DefaultLinger)
	def(&cfg.Regroup, DefaultRegroup)
	if cfg.SnapshotThreshold == 0 {
		cfg.SnapshotThreshold = DefaultSnapshotThreshold
	}
	if cfg.TrailingLogs == 0 {
		cfg.TrailingLogs = 10240
	}
	if cfg.SnapshotRetain == 0 {
		cfg.SnapshotRetain = 2
	}
	if cfg.MaxAppendEntries == 0 {
		cfg.MaxAppendEntries = 256
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.LogStore == "" {
		cfg.LogStore = LogStoreWAL
	}
	return cfg
}

// Peer is one member of a static cluster definition.
type Peer struct {
	ID       string
	RaftAddr string
}

// Validate says which field is wrong.
func (cfg Config) Validate() error {
	if len(cfg.Peers) > 0 && !slices.ContainsFunc(cfg.Peers, func(p Peer) bool { return p.ID == cfg.NodeID }) {
		return fmt.Errorf("raftlog: config: Peers does not include this node %q", cfg.NodeID)
	}
	switch {
	case cfg.NodeID == "":
		return errors.New("raftlog: config: NodeID is empty")
	case cfg.Dir == "":
		return errors.New("raftlog: config: Dir is empty")
	case cfg.RaftAddr == "" && cfg.Listener == nil && cfg.StreamLayer == nil:
		return errors.New("raftlog: config: RaftAddr is empty (and no Listener or StreamLayer is set)")
	case cfg.MaxAppendEntries > 1024:
		return errors.New("raftlog: config: MaxAppendEntries is above hashicorp/raft's limit of 1024")
	}
	return nil
}
