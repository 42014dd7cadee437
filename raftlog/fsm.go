package raftlog

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/diskio"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventAppended: Topic got new committed messages (the zero value).
	EventAppended EventKind = iota
	// EventTrimmed: Topic's oldest messages were dropped by retention.
	EventTrimmed
	// EventGroupReset: Group's position on Topic was reset.
	EventGroupReset
	// EventRedriven: dead letters of Group on Topic were redriven.
	EventRedriven
	// EventPurged: dead letters of Group on Topic were purged.
	EventPurged
	// EventGroupConfig: Group's delivery policy changed (Topic is empty).
	EventGroupConfig
	// EventResolved: Half left PENDING or EXPIRED (committed, rolled back
	// or expired, by whichever source); Group is its producer group. One
	// event per message; a resolution that repeats an earlier one reports
	// nothing.
	EventResolved
	// EventDeleted: Group's progress on Topic was deleted, or with an empty
	// Group the whole Topic.
	EventDeleted
)

// Event tells the node's owner what a batch changed, so that it can wake
// whoever waits for it (consumer dispatchers wait for new messages, and
// reload their state after a reset, redrive, purge, trim or new policy),
// and count what happened to half messages. A batch reports each event
// once.
type Event struct {
	Kind  EventKind
	Topic string
	Group string
	// Half is the half message as an EventResolved left it (without its
	// body once resolved). It must not be changed.
	Half *storepb.Half
}

// Hooks hear of the node's proposals and storage work, for metrics: the
// broker turns them into Prometheus histograms, so that raftlog needs no
// metrics library. Nil fields are skipped. They run on the node's and
// Raft's goroutines and must not block. Their durations come from the local
// clock, which never reaches the state.
type Hooks struct {
	// Applied: the FSM applied a batch of entries (those that changed the
	// store) in d, in the store's open transaction.
	Applied func(entries int, d time.Duration)
	// Committed: the store committed what was applied, in d (no fsync:
	// the store is fsynced once a second).
	Committed func(d time.Duration)
	// LogStored: the Raft log store wrote entries in d: with their fsync,
	// except on a leader that syncs its appends behind them (LogSynced).
	LogStored func(entries int, d time.Duration)
	// LogSynced: the leader's fsync behind its appends took d.
	LogSynced func(d time.Duration)
	// SnapshotPersisted: a snapshot of the store was written out in d.
	SnapshotPersisted func(d time.Duration)
	// Proposed: one log entry carrying len(waited) proposals was handed
	// to raft.Apply; waited[i] is how long proposal i took from the call
	// until then (its encoding and its wait in the batcher). Leader only.
	Proposed func(waited []time.Duration)
	// Replicated: raft.Apply of one entry came back without error d after
	// it was called: the leader's log append, replication, a quorum's
	// append, the commit and this node's apply. Leader only.
	Replicated func(d time.Duration)
}

// fsm applies committed log entries to the store. Each batch of entries is
// one bbolt transaction that also records the last applied index, so a
// restart skips what the store already has instead of applying it twice.
//
// Applying is write-behind: a batch is applied in the store writer's open
// transaction and answered at once; the committer commits behind it (at
// most every commitEvery), so the proposers do not wait for the bbolt
// commit and many batches share one. The dispatchers read inside the open
// transaction (Writer.Read); every other read of the store commits what
// is open first (halfstore.Writer), so nobody reads behind what was
// answered. A crash loses only what the log replays.
//
// A commit the disk refuses (full) stalls the fsm instead of stopping the
// node: bbolt rolled back what was applied since the last commit, so the
// fsm keeps those entries (pending), stops applying (ApplyBatch waits,
// which holds Raft's apply loop), refuses proposals with the error, and
// retries with backoff: apply the pending entries again, commit. Once that
// works, applying goes on where it stopped. Reads fail with the error
// meanwhile, as the writer refuses them.
type fsm struct {
	store   *halfstore.Store
	w       *halfstore.Writer
	logger  *slog.Logger
	onApply func([]Event)
	hooks   Hooks
	// stop ends the wait of a stalled fsm (the node is closing).
	stop <-chan struct{}
	// onStall runs when a commit fails (the node hands over leadership).
	onStall func()
	// logged, when set, waits until this node's log holds the entries up
	// to an index durably (the leader syncs its appends behind them), or
	// fails with ErrShutdown: nothing is applied, so nobody is answered,
	// before that.
	logged func(index uint64) error

	// applied counts the entries that changed the store since start: proof
	// that a restart re-applies nothing.
	applied atomic.Uint64
	// stamp is the latest time stamped into an applied command (Unix ns),
	// as the store records it (halfstore.Tx.Stamp).
	stamp atomic.Int64
	// kick wakes the committer after a batch was applied.
	kick chan struct{}

	// mu orders applying, committing and retrying.
	mu sync.Mutex
	// pending: the entries applied since the fsm's last commit that
	// worked, to apply again if a commit fails.
	pending []*raft.Log
	// stalled is the failed commit's error, nil while commits work;
	// resumed is closed when they work again, stalling when a commit
	// fails (proposers waiting for their entry's result stop waiting).
	stalled  error
	resumed  chan struct{}
	stalling chan struct{}
}

// Backoff of the retries of a failed commit.
const (
	minCommitRetry = 50 * time.Millisecond
	maxCommitRetry = 2 * time.Second
)

func newFSM(store *halfstore.Store, logger *slog.Logger, onApply func([]Event), hooks Hooks, stop <-chan struct{}, onStall func()) *fsm {
	return &fsm{store: store, w: store.Writer(), logger: logger, onApply: onApply, hooks: hooks, stop: stop, onStall: onStall,
		kick: make(chan struct{}, 1), stalling: make(chan struct{})}
}

// loadStamp reads the latest stamp from the store (at start, and after a
// snapshot replaced it).
func (f *fsm) loadStamp() error {
	return f.store.View(func(tx *halfstore.Tx) error {
		f.stamp.Store(tx.Stamp())
		return nil
	})
}

// commitEvery paces the committer: what was applied within it shares one
// bbolt commit. A commit costs mostly per commit, not per entry (the meta
// page, the free list, the branch pages above every changed leaf and
// their writes): with a commit per applied batch it was the largest item
// of a follower's CPU. Every commit also rewrites the pages it touched, so
// fewer commits write fewer bytes, which the node's log appends would
// otherwise wait behind on the disk. Pacing loses nothing: applied
// entries are in the log, a crash replays what was not committed, and
// reads see the open transaction (Writer.Read) or commit it first (View:
// the health watcher every 200 ms, the check-back scheduler at least every
// 250 ms, so the store commits about every 200 ms in practice).
// docs/decisions.md has the numbers that chose 100 ms, then 500 ms.
const commitEvery = 500 * time.Millisecond

// commitBehind commits what was applied, at most once per commitEvery,
// until stop is closed; a failed commit is retried until it works.
func (f *fsm) commitBehind() {
	var last time.Time
	for {
		select {
		case <-f.stop:
			return
		case <-f.kick:
		}
		if wait := commitEvery - time.Since(last); wait > 0 {
			select {
			case <-f.stop:
				return
			case <-time.After(wait):
			}
		}
		last = time.Now()
		if err := f.commit(); err != nil {
			f.retryCommits()
		}
	}
}

// commit commits the writer's open transaction. A failure stalls the fsm.
func (f *fsm) commit() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	start := time.Now()
	did, err := f.w.Commit()
	if err != nil {
		f.stallLocked(err)
		return err
	}
	f.pending = f.pending[:0]
	if did && f.hooks.Committed != nil {
		f.hooks.Committed(time.Since(start))
	}
	return nil
}

// stallLocked records a failed commit, once per stall.
func (f *fsm) stallLocked(err error) {
	if f.stalled != nil {
		return
	}
	f.stalled = err
	f.resumed = make(chan struct{})
	close(f.stalling)
	f.logger.Error("cannot commit applied entries: the node takes no writes and applies nothing until a commit works again; retrying",
		"err", err, "entries_to_apply_again", len(f.pending))
	if f.onStall != nil {
		go f.onStall()
	}
}

// Stalled is the failed commit's error while the fsm is stalled, else nil.
func (f *fsm) Stalled() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stalled
}

// Stalling is closed when the next stall begins.
func (f *fsm) Stalling() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stalling
}

// retryCommits applies the pending entries again and commits, with
// backoff, until that works or the node closes.
func (f *fsm) retryCommits() {
	wait := minCommitRetry
	for tries := 1; ; tries++ {
		select {
		case <-f.stop:
			return
		case <-time.After(wait):
		}
		f.mu.Lock()
		err := f.w.Retry(func(tx *halfstore.Tx) error {
			_, _, _, err := applyLogs(tx, f.pending)
			return err
		})
		if err == nil {
			f.logger.Info("the store commits again; applying goes on", "tries", tries, "entries_applied_again", len(f.pending))
			f.pending = f.pending[:0]
			f.stalled = nil
			close(f.resumed)
			f.stalling = make(chan struct{})
			f.mu.Unlock()
			return
		}
		f.stalled = err
		f.mu.Unlock()
		if f.onStall != nil {
			f.onStall()
		}
		wait = min(2*wait, maxCommitRetry)
	}
}

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply implements raft.FSM for the rare single-entry path.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies a batch of committed entries in one transaction. Each
// entry's response is an applied (the command's result or its refusal),
// or one applied per command for an entry of merged proposals. While the
// fsm is stalled it waits.
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	if f.logged != nil && len(logs) > 0 {
		if err := f.logged(logs[len(logs)-1].Index); err != nil {
			return shutDown(len(logs), err)
		}
	}
	start := time.Now()
	results, a, count, err := f.applyOrWait(logs)
	if errors.Is(err, ErrShutdown) {
		return shutDown(len(results), err)
	}
	if err != nil {
		// The log is the truth and every node must apply it identically; a
		// store that cannot take a write cannot go on.
		f.logger.Error("cannot apply committed entries", "err", err)
		panic(fmt.Sprintf("raftlog: apply: %v", err))
	}
	f.applied.Add(count)
	if a.latest > f.stamp.Load() {
		f.stamp.Store(a.latest)
	}
	if count > 0 && f.hooks.Applied != nil {
		f.hooks.Applied(int(count), time.Since(start))
	}
	select {
	case f.kick <- struct{}{}:
	default:
	}
	// Whoever the events wake reads through the writer's open transaction
	// or commits it first: they see what the events tell of.
	if len(a.events) > 0 && f.onApply != nil {
		f.onApply(a.events)
	}
	return results
}

// shutDown is n results of a node that closed before it applied them.
func shutDown(n int, err error) []interface{} {
	results := make([]interface{}, n)
	for i := range results {
		results[i] = applied{err: err}
	}
	return results
}

// applyOrWait applies logs in the writer's open transaction and keeps them
// as pending. A failed commit (the fsm's or a read's) stalls it: it waits
// until commits work again, then applies. ErrShutdown: the node closed
// while it waited.
func (f *fsm) applyOrWait(logs []*raft.Log) ([]interface{}, *applier, uint64, error) {
	for {
		f.mu.Lock()
		resumed := f.resumed
		if f.stalled == nil {
			var results []interface{}
			var a *applier
			var count uint64
			err := f.w.Apply(func(tx *halfstore.Tx) (err error) {
				results, a, count, err = applyLogs(tx, logs)
				return err
			})
			if !errors.Is(err, diskio.ErrWrite) {
				if err == nil {
					f.pending = append(f.pending, logs...)
				}
				f.mu.Unlock()
				return results, a, count, err
			}
			// A read's commit failed: the committer retries.
			f.stallLocked(err)
			resumed = f.resumed
			select {
			case f.kick <- struct{}{}:
			default:
			}
		}
		f.mu.Unlock()
		select {
		case <-resumed:
		case <-f.stop:
			return make([]interface{}, len(logs)), nil, 0, ErrShutdown
		}
	}
}

// applyLogs applies the committed entries in tx, skipping those the store
// has already (a replay after a restart), and records the last applied
// index. It returns each entry's response, the applier (its events) and
// how many commands changed the store.
func applyLogs(tx *halfstore.Tx, logs []*raft.Log) ([]interface{}, *applier, uint64, error) {
	results := make([]interface{}, len(logs))
	a := newApplier(tx)
	var count uint64
	last := tx.AppliedIndex()
	for i, l := range logs {
		if l.Index <= last {
			// Already in the store: replay after a restart.
			continue
		}
		last = l.Index
		if l.Type != raft.LogCommand {
			continue
		}
		cmd := &raftpb.Command{}
		if err := proto.Unmarshal(l.Data, cmd); err != nil {
			results[i] = applied{err: fmt.Errorf("%w: undecodable entry at index %d: %v", ErrUnknownCommand, l.Index, err)}
			continue
		}
		res, err := a.apply(cmd)
		if err != nil && !isRefusal(err) {
			return nil, nil, 0, fmt.Errorf("index %d (%s): %w", l.Index, describe(cmd), err)
		}
		if batch, ok := res.([]applied); ok {
			// A batch answers each of its proposals.
			results[i] = batch
			count += uint64(len(batch))
			continue
		}
		results[i] = applied{result: res, err: err}
		count++
	}
	if last == tx.AppliedIndex() {
		return results, a, count, nil
	}
	if a.latest > tx.Stamp() {
		if err := tx.SetStamp(a.latest); err != nil {
			return nil, nil, 0, err
		}
	}
	return results, a, count, tx.SetAppliedIndex(last)
}

// Snapshot captures the store in a read transaction; Persist streams it out
// while the FSM goes on applying.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	sn, err := f.store.Snapshot()
	if err != nil {
		return nil, err
	}
	return &fsmSnapshot{sn: sn, persisted: f.hooks.SnapshotPersisted}, nil
}

// Restore replaces the store with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.store.Restore(rc); err != nil {
		return err
	}
	idx, err := f.store.AppliedIndex()
	if err != nil {
		return err
	}
	if err := f.loadStamp(); err != nil {
		return err
	}
	f.logger.Info("store restored from snapshot", "applied_index", idx)
	return nil
}

type fsmSnapshot struct {
	sn        *halfstore.Snapshot
	persisted func(time.Duration)
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	if _, err := s.sn.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftlog: persist snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return err
	}
	if s.persisted != nil {
		s.persisted(time.Since(start))
	}
	return nil
}

func (s *fsmSnapshot) Release() { s.sn.Release() }
