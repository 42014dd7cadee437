// Package raftlog is the Raft node of a txmq broker: hashicorp/raft with its
// log on bbolt (raft-boltdb), file snapshots, a TCP transport, the state
// machine that applies commands to the halfstore, and the encoding of those
// commands (package raftpb).
//
// Proposals are group-committed: hashicorp/raft gathers every proposal that
// is waiting when the leader loop runs (up to MaxAppendEntries) into one log
// write (one fsynced bbolt commit), and hands the committed batch to the
// FSM, which applies it in one bbolt transaction of the store. The store is
// not fsynced per batch: the log and the snapshots rebuild it, and a store
// that a power cut may have torn is discarded on start
// (halfstore.OpenUnsynced).
package raftlog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// ErrNotLeader is returned (wrapped in a *NotLeaderError) by calls that only
// the leader can serve.
var ErrNotLeader = errors.New("not the leader")

// ErrShutdown: the node is closed.
var ErrShutdown = errors.New("raftlog: node is shut down")

// Errors of membership and maintenance calls.
var (
	// ErrNotMember: no server of that ID is in the configuration.
	ErrNotMember = errors.New("not a member of the cluster")
	// ErrIsLeader: leadership cannot move to the node that has it.
	ErrIsLeader = errors.New("already the leader")
	// ErrSnapshot: a snapshot could not be taken (nothing new since the
	// last one, or one is being taken).
	ErrSnapshot = errors.New("snapshot not taken")
)

// NotLeaderError names the current leader, if one is known.
type NotLeaderError struct {
	LeaderID       string
	LeaderRaftAddr string
	// Unknown is set when the proposal may or may not have been committed
	// (leadership was lost while it was in flight). Retrying with the same
	// transaction ID or key is safe either way.
	Unknown bool
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader, and no leader is known (election in progress or no quorum)"
	}
	return fmt.Sprintf("not the leader; the leader is %s at %s", e.LeaderID, e.LeaderRaftAddr)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// Config configures a node. Defaults fills the zero fields.
type Config struct {
	// NodeID is this node's Raft server ID, unique in the cluster.
	NodeID string
	// Dir holds fsm.db (the halfstore), raft.db (log and stable store) and
	// snapshots/.
	Dir string
	// RaftAddr is the address the Raft transport listens on.
	RaftAddr string
	// AdvertiseAddr is the address other nodes reach this one at; defaults
	// to the address RaftAddr bound to.
	AdvertiseAddr string
	// Bootstrap makes a brand-new node (no Raft state on disk) start a
	// cluster: with itself as the only voter, or with Peers when set.
	// Ignored when state exists.
	Bootstrap bool
	// Peers is the static membership every node of a new cluster is
	// started with (--peers); it must include this node.
	Peers []Peer
	// StreamLayer replaces the TCP transport's listener and dialer: tests
	// wrap it to drop or delay links. RaftAddr is then unused.
	StreamLayer raft.StreamLayer

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
	// ProposeTimeout bounds a proposal when ctx has no deadline.
	ProposeTimeout time.Duration

	Logger *slog.Logger
	// OnApply is called after each applied batch that changed something
	// worth waking for. It runs on the FSM goroutine: it must not block.
	OnApply func([]Event)
	// Hooks hear of log writes, applied batches and snapshots, for metrics.
	Hooks Hooks
}

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
	case cfg.RaftAddr == "":
		return errors.New("raftlog: config: RaftAddr is empty")
	case cfg.MaxAppendEntries > 1024:
		return errors.New("raftlog: config: MaxAppendEntries is above hashicorp/raft's limit of 1024")
	}
	return nil
}

// Node is one member of the Raft cluster and the owner of its store.
type Node struct {
	cfg       Config
	raft      *raft.Raft
	fsm       *fsm
	store     *halfstore.Store
	logStore  *logStore
	transport *raft.NetworkTransport

	// closing gates proposals against Close: hashicorp/raft never answers a
	// proposal still queued when it shuts down, so Propose must not queue
	// one after Close began, and must stop waiting when it does.
	closing  sync.RWMutex
	closed   bool
	shutdown chan struct{}
	// syncDone is closed when syncStore has returned.
	syncDone chan struct{}
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
		}
	}()

	// The store is not fsynced per batch: the Raft log and snapshots
	// rebuild it, and a store a power cut may have torn is discarded, not
	// opened (halfstore.OpenUnsynced, docs/decisions.md).
	store, how, err := halfstore.OpenUnsynced(filepath.Join(cfg.Dir, "fsm.db"))
	if err != nil {
		return nil, err
	}
	n.store = store
	switch {
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
	db, err := raftboltdb.New(raftboltdb.Options{
		Path: filepath.Join(cfg.Dir, "raft.db"),
		// As for fsm.db: the freelist is rebuilt on open instead of
		// written on every commit. raft.db stays fsynced on every write.
		BoltOptions: &bbolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true, FreelistType: bbolt.FreelistMapType},
	})
	if err != nil {
		return nil, fmt.Errorf("raftlog: log store: %w", err)
	}
	n.logStore = &logStore{db: db, stored: cfg.Hooks.LogStored}

	layer := cfg.StreamLayer
	if layer == nil {
		if layer, err = listenTCP(cfg.RaftAddr, cfg.AdvertiseAddr); err != nil {
			return nil, err
		}
	}
	n.transport = raft.NewNetworkTransportWithLogger(layer, 5, 10*time.Second, hlog)

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

	n.fsm = &fsm{store: n.store, logger: logger, onApply: cfg.OnApply, hooks: cfg.Hooks}
	// Replication reads the entries it sends from the log; the newest are
	// served from memory instead of a bbolt read and decode each.
	logs, err := raft.NewLogCache(logCacheSize, n.logStore)
	if err != nil {
		return nil, fmt.Errorf("raftlog: log cache: %w", err)
	}
	if n.raft, err = raft.NewRaft(rc, n.fsm, logs, n.logStore, snaps, n.transport); err != nil {
		return nil, fmt.Errorf("raftlog: start raft: %w", err)
	}
	if cfg.Bootstrap {
		has, err := raft.HasExistingState(n.logStore, n.logStore, snaps)
		if err != nil {
			n.raft.Shutdown()
			return nil, fmt.Errorf("raftlog: %w", err)
		}
		if !has {
			servers := []raft.Server{{ID: rc.LocalID, Address: n.transport.LocalAddr(), Suffrage: raft.Voter}}
			if len(cfg.Peers) > 0 {
				servers = nil
				for _, p := range cfg.Peers {
					servers = append(servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
				}
			}
			f := n.raft.BootstrapCluster(raft.Configuration{Servers: servers})
			if err := f.Error(); err != nil {
				n.raft.Shutdown()
				return nil, fmt.Errorf("raftlog: bootstrap: %w", err)
			}
			logger.Info("bootstrapped a new cluster", "raft_addr", string(n.transport.LocalAddr()))
		}
	}
	n.syncDone = make(chan struct{})
	go n.syncStore(logger)
	ok = true
	return n, nil
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

// AppliedBatches counts the store transactions (one fsync each) that
// carried those entries.
func (n *Node) AppliedBatches() uint64 { return n.fsm.batches.Load() }

func (n *Node) notLeader() error {
	id, addr := n.Leader()
	return &NotLeaderError{LeaderID: id, LeaderRaftAddr: addr}
}

// propose replicates a command and applies it, returning what applying it
// gave once a majority has it on disk and this node applied it. The typed
// calls of commands.go are its only callers.
func (n *Node) propose(ctx context.Context, cmd *raftpb.Command) (applied, error) {
	data, err := proto.Marshal(cmd)
	if err != nil {
		return applied{}, fmt.Errorf("raftlog: encode command: %w", err)
	}
	timeout := n.cfg.ProposeTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	if timeout <= 0 {
		return applied{}, context.DeadlineExceeded
	}
	n.closing.RLock()
	if n.closed {
		n.closing.RUnlock()
		return applied{}, ErrShutdown
	}
	f := n.raft.Apply(data, timeout)
	n.closing.RUnlock()
	done := make(chan error, 1)
	go waitApplied(f, done)
	select {
	case <-ctx.Done():
		return applied{}, ctx.Err()
	case <-n.shutdown:
		// The entry may or may not have been committed.
		return applied{}, ErrShutdown
	case err = <-done:
	}
	switch {
	case err == nil:
	case errors.Is(err, raft.ErrNotLeader):
		return applied{}, n.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
		e := n.notLeader().(*NotLeaderError)
		e.Unknown = true
		return applied{}, e
	case errors.Is(err, raft.ErrRaftShutdown):
		return applied{}, ErrShutdown
	default:
		return applied{}, fmt.Errorf("raftlog: propose: %w", err)
	}
	a, ok := f.Response().(applied)
	if !ok {
		return applied{}, fmt.Errorf("raftlog: propose: no result (entry already applied?)")
	}
	return a, nil
}

// waitApplied waits for a proposal's outcome. hashicorp/raft leaves a
// proposal caught by Shutdown between commit and apply unanswered; its
// waiter then stays blocked (Propose itself returns ErrShutdown). That
// happens only while a node shuts down, which is why tests tell goleak
// about this function.
func waitApplied(f raft.ApplyFuture, done chan<- error) { done <- f.Error() }

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

// Member is one server of the Raft configuration.
type Member struct {
	ID       string
	RaftAddr string
	Suffrage string
	Leader   bool
}

// Status is what `brokerctl cluster status` shows of this node.
type Status struct {
	NodeID            string
	State             string
	LeaderID          string
	LeaderRaftAddr    string
	Term              uint64
	CommitIndex       uint64
	AppliedIndex      uint64
	LastLogIndex      uint64
	StoreAppliedIndex uint64
	Members           []Member
}

// Status reads the node's Raft state and membership.
func (n *Node) Status() (Status, error) {
	stats := n.raft.Stats()
	num := func(k string) uint64 {
		v, _ := strconv.ParseUint(stats[k], 10, 64)
		return v
	}
	st := Status{
		NodeID:       n.cfg.NodeID,
		State:        n.raft.State().String(),
		Term:         num("term"),
		CommitIndex:  num("commit_index"),
		AppliedIndex: num("applied_index"),
		LastLogIndex: num("last_log_index"),
	}
	st.LeaderID, st.LeaderRaftAddr = n.Leader()
	var err error
	if st.StoreAppliedIndex, err = n.store.AppliedIndex(); err != nil {
		return st, err
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return st, fmt.Errorf("raftlog: configuration: %w", err)
	}
	for _, s := range f.Configuration().Servers {
		st.Members = append(st.Members, Member{
			ID:       string(s.ID),
			RaftAddr: string(s.Address),
			Suffrage: s.Suffrage.String(),
			Leader:   string(s.ID) == st.LeaderID,
		})
	}
	return st, nil
}

// Snapshot takes a snapshot now, truncates the log behind it, and returns
// the index it covers.
func (n *Node) Snapshot() (uint64, error) {
	f := n.raft.Snapshot()
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return 0, fmt.Errorf("raftlog: snapshot: %w", err)
	}
	rc.Close()
	return meta.Index, nil
}

// membershipTimeout bounds a configuration change.
const membershipTimeout = 30 * time.Second

func (n *Node) leaderErr(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return n.notLeader()
	}
	return err
}

// AddVoter makes a node a voting member (leader only). It reports false
// when the node already was one at that address.
func (n *Node) AddVoter(id, raftAddr string) (bool, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, err
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id && string(s.Address) == raftAddr && s.Suffrage == raft.Voter {
			return false, nil
		}
	}
	if err := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, membershipTimeout).Error(); err != nil {
		return false, n.leaderErr(err)
	}
	return true, nil
}

// RemoveServer takes a node out of the cluster (leader only).
func (n *Node) RemoveServer(id string) error {
	return n.leaderErr(n.raft.RemoveServer(raft.ServerID(id), 0, membershipTimeout).Error())
}

// TransferLeadership hands leadership to the node id, or to the most
// up-to-date follower when id is empty (leader only).
func (n *Node) TransferLeadership(id string) error {
	if id == "" {
		return n.leaderErr(n.raft.LeadershipTransfer().Error())
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	if id == n.cfg.NodeID {
		return fmt.Errorf("%w: node %s is the leader", ErrIsLeader, id)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return n.leaderErr(n.raft.LeadershipTransferToServer(s.ID, s.Address).Error())
		}
	}
	return fmt.Errorf("%w: node %q", ErrNotMember, id)
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

func listenTCP(bind, advertise string) (raft.StreamLayer, error) {
	ln, err := net.Listen("tcp", bind)
	if err != nil {
		return nil, fmt.Errorf("raftlog: listen %s: %w", bind, err)
	}
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("raftlog: advertise address %q: %w", advertise, err)
	}
	return &tcpLayer{Listener: ln, advertise: adv}, nil
}

// tcpLayer is raft's StreamLayer over a listener we opened ourselves, so
// that ":0" works and the advertised address can differ from the bound one.
type tcpLayer struct {
	net.Listener
	advertise net.Addr
}

func (t *tcpLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

func (t *tcpLayer) Addr() net.Addr { return t.advertise }

// newHCLogger routes hashicorp/raft's logging into slog, at warn and above
// unless the slog handler asks for debug.
func newHCLogger(l *slog.Logger) hclog.Logger {
	level := hclog.Warn
	if l.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       level,
		Output:      slogWriter{l},
		DisableTime: true,
	})
}

// slogWriter turns each line hclog writes ("[WARN]  raft: text: k=v") into
// one slog record at the same level.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for prefix, lv := range map[string]slog.Level{
		"[TRACE]": slog.LevelDebug, "[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo,
		"[WARN]": slog.LevelWarn, "[ERROR]": slog.LevelError,
	} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			level, msg = lv, strings.TrimSpace(rest)
			break
		}
	}
	msg = strings.TrimPrefix(msg, "raft: ")
	w.l.Log(context.Background(), level, msg)
	return len(p), nil
}

var _ io.Writer = slogWriter{}
