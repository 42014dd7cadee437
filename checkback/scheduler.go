// Package checkback is the check-back scheduler: on the leader, it finds
// half messages whose next check is due, asks a live instance of their
// producer group whether the local transaction committed, and proposes the
// outcome through Raft. The schedule itself (next check time, attempts) is
// replicated state in the halfstore, so a new leader resumes it.
//
// The clock, the caller and the random source are injected, so tests drive
// the scheduler round by round with a fake clock (RunOnce).
package checkback

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Proposer replicates the outcomes of checks: the Raft node.
type Proposer interface {
	Resolve(ctx context.Context, now time.Time, op *raftpb.Resolve) (raftlog.HalfResult, error)
	RecordCheck(ctx context.Context, now time.Time, op *raftpb.RecordCheck) (raftlog.HalfResult, error)
	Expire(ctx context.Context, now time.Time, op *raftpb.Expire) (raftlog.HalfResult, error)
}

// Schedule is what the scheduler reads of the store, all within one
// consistent read (halfstore.Tx has these methods).
type Schedule interface {
	// ScheduledGroups lists the producer groups with pending messages.
	ScheduledGroups() ([]string, error)
	// ProducerGroup is a group's stored policy (zero fields: defaults).
	ProducerGroup(name string) (*storepb.ProducerGroup, error)
	// DueHalf lists a group's pending messages due at now, earliest first.
	DueHalf(group string, now int64, skip func(id string) bool, keep func(*storepb.Half) bool, limit int) ([]*storepb.Half, error)
	// NextCheck is when a group's earliest check is due.
	NextCheck(group string) (int64, bool)
	// Half is one half message.
	Half(id string) (*storepb.Half, error)
}

// Store gives consistent reads of the schedule.
type Store interface {
	ReadSchedule(fn func(Schedule) error) error
}

// Errors of CheckNow.
var (
	// ErrNotPending: the message is resolved; it is not checked.
	ErrNotPending = errors.New("not pending")
	// ErrCheckRunning: a check of the message is in progress already.
	ErrCheckRunning = errors.New("check in progress")
)

// Scheduler runs check-backs on the leader.
type Scheduler struct {
	cfg   Config
	store Store
	prop  Proposer
	reg   *Registry
	log   *slog.Logger
	wake  chan struct{}

	mu sync.Mutex
	// inflight: messages being called about or whose outcome is being
	// proposed; a scan skips them.
	inflight map[string]bool
	// settled: messages released since the last round began. That round's
	// read transaction may predate their outcome and still show them due,
	// so it skips them too; the next round reads after the outcome.
	settled map[string]bool
	// calling and perGroup count the calls to producers in flight,
	// proposing the outcomes in Raft.
	calling   int
	perGroup  map[string]int
	proposing int
	lastSweep map[string]time.Time
}

// New returns a scheduler; Run starts it.
func New(cfg Config, store Store, prop Proposer) (*Scheduler, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Scheduler{
		cfg:       cfg,
		store:     store,
		prop:      prop,
		log:       cfg.Logger.With("component", "checkback"),
		wake:      make(chan struct{}, 1),
		inflight:  map[string]bool{},
		settled:   map[string]bool{},
		perGroup:  map[string]int{},
		lastSweep: map[string]time.Time{},
	}
	s.reg = newRegistry(cfg.Now, cfg.Lease, func(string) { s.Wake() })
	return s, nil
}

// Registry is the scheduler's view of live producer instances.
func (s *Scheduler) Registry() *Registry { return s.reg }

// Config is the configuration in force.
func (s *Scheduler) Config() Config { return s.cfg }

// Close releases the caller's connections.
func (s *Scheduler) Close() error { return s.cfg.Caller.Close() }

// Wake makes a running scheduler look at the schedule now.
func (s *Scheduler) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run checks due messages until ctx ends (leadership lost), then waits for
// the checks it started.
func (s *Scheduler) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	s.mu.Lock()
	s.lastSweep = map[string]time.Time{}
	s.mu.Unlock()
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-s.wake:
		}
		next, err := s.round(ctx, &wg)
		if err != nil && ctx.Err() == nil {
			s.log.Error("check-back round failed", "err", err)
		}
		wait := s.cfg.ScanInterval
		if d := next.Sub(s.cfg.Now()); d < wait {
			wait = max(d, time.Millisecond)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(wait)
	}
}

// RunOnce runs one round and waits for the checks it started: for tests
// that move a fake clock.
func (s *Scheduler) RunOnce(ctx context.Context) error {
	var wg sync.WaitGroup
	_, err := s.round(ctx, &wg)
	wg.Wait()
	return err
}

type job struct {
	half   *storepb.Half
	policy Policy
	// sweep: the group has nobody to ask; only expire what is too old.
	sweep bool
}

// round looks at every producer group with pending messages and starts the
// checks that are due and fit the concurrency bounds. It returns when the
// next check is due.
func (s *Scheduler) round(ctx context.Context, wg *sync.WaitGroup) (time.Time, error) {
	now := s.cfg.Now()
	next := now.Add(s.cfg.ScanInterval)
	var jobs []job
	s.mu.Lock()
	// Every check started now may need a proposal place when its call ends.
	budget := min(s.cfg.MaxConcurrent-s.calling, s.cfg.MaxProposals-s.proposing-s.calling)
	clear(s.settled)
	s.mu.Unlock()
	// The scan's duration is measured on the real clock: the injected one
	// may stand still.
	started := time.Now()
	err := s.store.ReadSchedule(func(tx Schedule) error {
		groups, err := tx.ScheduledGroups()
		if err != nil {
			return err
		}
		for _, g := range groups {
			pol, err := s.Policy(tx, g)
			if err != nil {
				return err
			}
			if !s.reg.HasLive(g) && pol.Callback.IsZero() {
				found, err := s.sweep(tx, g, pol, now, max(budget, 0))
				if err != nil {
					return err
				}
				budget -= len(found)
				jobs = append(jobs, found...)
				continue
			}
			if free := min(s.groupFree(g), budget); free > 0 {
				due, err := tx.DueHalf(g, now.UnixNano(), s.isInflight, nil, free)
				if err != nil {
					return err
				}
				budget -= len(due)
				for _, h := range due {
					jobs = append(jobs, job{half: h, policy: pol})
				}
			}
			if at, ok := tx.NextCheck(g); ok && at > now.UnixNano() && time.Unix(0, at).Before(next) {
				next = time.Unix(0, at)
			}
		}
		return nil
	})
	if s.cfg.ObserveScan != nil {
		s.cfg.ObserveScan(time.Since(started))
	}
	for _, j := range jobs {
		s.start(ctx, wg, j)
	}
	return next, err
}

// sweepLimit bounds one age sweep of a group; the next sweep goes on.
const sweepLimit = 10000

// sweep finds the due messages of a group nobody can answer for that are
// older than max_half_age, at most every AgeSweepInterval.
func (s *Scheduler) sweep(tx Schedule, g string, pol Policy, now time.Time, limit int) ([]job, error) {
	s.mu.Lock()
	last, swept := s.lastSweep[g]
	if swept && now.Sub(last) < s.cfg.AgeSweepInterval {
		s.mu.Unlock()
		return nil, nil
	}
	s.lastSweep[g] = now
	s.mu.Unlock()
	old, err := tx.DueHalf(g, now.UnixNano(), s.isInflight, func(h *storepb.Half) bool { return s.tooOld(h, pol, now) }, min(limit, sweepLimit))
	if err != nil {
		return nil, err
	}
	if len(old) == min(limit, sweepLimit) {
		// There may be more: come back at the next round.
		s.mu.Lock()
		delete(s.lastSweep, g)
		s.mu.Unlock()
	}
	out := make([]job, 0, len(old))
	for _, h := range old {
		out = append(out, job{half: h, policy: pol, sweep: true})
	}
	return out, nil
}

func (s *Scheduler) tooOld(h *storepb.Half, pol Policy, now time.Time) bool {
	return !now.Before(time.Unix(0, h.CreatedAt).Add(pol.MaxHalfAge))
}

func (s *Scheduler) isInflight(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.inflight[id] || s.settled[id]
}

func (s *Scheduler) groupFree(group string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg.MaxPerGroup - s.perGroup[group]
}

// claim marks a message as being checked and takes a call slot; false if
// it already is.
func (s *Scheduler) claim(h *storepb.Half) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight[h.Id] {
		return false
	}
	s.inflight[h.Id] = true
	s.calling++
	s.perGroup[h.ProducerGroup]++
	return true
}

// called gives back the call slot once no call to a producer is in flight
// for h; the message stays claimed while its outcome is proposed, and the
// scheduler looks for the next due check at once. The body is dropped: no
// proposal needs it, and up to MaxProposals messages wait for Raft.
func (s *Scheduler) called(h *storepb.Half) {
	h.Body = nil
	s.mu.Lock()
	s.calling--
	if s.perGroup[h.ProducerGroup]--; s.perGroup[h.ProducerGroup] <= 0 {
		delete(s.perGroup, h.ProducerGroup)
	}
	s.proposing++
	s.mu.Unlock()
	s.Wake()
}

// release ends the claim once the outcome is proposed.
func (s *Scheduler) release(h *storepb.Half) {
	s.mu.Lock()
	delete(s.inflight, h.Id)
	s.settled[h.Id] = true
	s.proposing--
	s.mu.Unlock()
	s.Wake()
}

func (s *Scheduler) start(ctx context.Context, wg *sync.WaitGroup, j job) {
	if !s.claim(j.half) {
		return
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer s.release(j.half)
		if j.sweep {
			s.called(j.half)
			s.expire(ctx, j.half, j.policy, "older than max_half_age with no producer instance to ask")
			return
		}
		s.process(ctx, j.half, j.policy)
	}()
}
