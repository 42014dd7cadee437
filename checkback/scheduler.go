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
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/bounds"
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

// Policy is a producer group's check-back policy in force.
type Policy struct {
	MaxChecks  uint32
	Backoff    time.Duration
	MaxBackoff time.Duration
	MaxHalfAge time.Duration
	// Rollback: expired messages are rolled back instead of parked.
	Rollback bool
	// Callback is used when no instance is registered.
	Callback Endpoint
}

// Defaults (SEMANTICS.md › Defaults).
const (
	DefaultMaxChecks         = 15
	DefaultBackoff           = 6 * time.Second
	DefaultMaxBackoff        = 60 * time.Second
	DefaultMaxHalfAge        = 24 * time.Hour
	DefaultCallTimeout       = 3 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultLease             = 10 * time.Second
	// DefaultMaxConcurrent and DefaultMaxPerGroup bound the calls to
	// producers in flight, in all and per producer group.
	DefaultMaxConcurrent = 64
	DefaultMaxPerGroup   = 8
)

// Config configures a Scheduler. Defaults fills the zero fields.
type Config struct {
	// Policy applies to groups without their own (brokerctl group config).
	Policy Policy
	// CallTimeout bounds one check-back call.
	CallTimeout time.Duration
	// MaxConcurrent bounds the check-back calls to producers in flight in
	// all; MaxPerGroup those to one producer group, so a slow group cannot
	// starve the others. A call's slot is free again once the producer
	// answered: the Raft write of the outcome does not hold it.
	MaxConcurrent int
	MaxPerGroup   int
	// MaxProposals bounds the outcomes (resolutions, recorded checks,
	// expiries) being proposed at once; while it is reached no call
	// starts. Default: 4 × MaxConcurrent.
	MaxProposals int
	// ScanInterval is the longest wait between two looks at the schedule.
	ScanInterval time.Duration
	// AgeSweepInterval: how often the messages of a group with no
	// instance are looked at for max_half_age (they are not checked, and
	// use no attempt, while nobody can answer).
	AgeSweepInterval time.Duration
	// HeartbeatInterval is what producers are told; an instance whose
	// lease (about three heartbeats) ends is dropped.
	HeartbeatInterval time.Duration
	Lease             time.Duration

	Now    func() time.Time
	Caller Caller
	// Observe, when set, hears of every check-back call: the producer
	// group, the result (commit, rollback, unknown, error, timeout,
	// not_reached, no_instance) and how long the call took.
	Observe func(group, result string, took time.Duration)
	// ObserveScan, when set, hears how long each look at the schedule
	// (the read transaction that finds what is due) took.
	ObserveScan func(took time.Duration)
	// Jitter returns a factor in [0.8, 1.2) applied to every backoff.
	Jitter func() float64
	Logger *slog.Logger
}

// Defaults returns cfg with its zero fields set.
func (cfg Config) Defaults() Config {
	p := &cfg.Policy
	if p.MaxChecks == 0 {
		p.MaxChecks = DefaultMaxChecks
	}
	dur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	dur(&p.Backoff, DefaultBackoff)
	dur(&p.MaxBackoff, DefaultMaxBackoff)
	dur(&p.MaxHalfAge, DefaultMaxHalfAge)
	dur(&cfg.CallTimeout, DefaultCallTimeout)
	dur(&cfg.ScanInterval, 250*time.Millisecond)
	dur(&cfg.AgeSweepInterval, 30*time.Second)
	dur(&cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	dur(&cfg.Lease, DefaultLease)
	if cfg.MaxConcurrent == 0 {
		cfg.MaxConcurrent = DefaultMaxConcurrent
	}
	if cfg.MaxPerGroup == 0 {
		cfg.MaxPerGroup = DefaultMaxPerGroup
	}
	if cfg.MaxProposals == 0 {
		cfg.MaxProposals = 4 * cfg.MaxConcurrent
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Caller == nil {
		cfg.Caller = NewNetCaller()
	}
	if cfg.Jitter == nil {
		cfg.Jitter = func() float64 { return 0.8 + 0.4*rand.Float64() }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

// Validate says which field is wrong.
func (cfg Config) Validate() error {
	p := cfg.Policy
	if err := errors.Join(
		bounds.MaxChecks.Check("MaxChecks", p.MaxChecks),
		bounds.CheckBackoff.Check("Backoff", p.Backoff),
		bounds.MaxCheckBackoff.Check("MaxBackoff", p.MaxBackoff),
		bounds.MaxHalfAge.Check("MaxHalfAge", p.MaxHalfAge),
	); err != nil {
		return fmt.Errorf("checkback: %w", err)
	}
	switch {
	case p.MaxBackoff < p.Backoff:
		return fmt.Errorf("checkback: backoff %s is above the max backoff %s", p.Backoff, p.MaxBackoff)
	case cfg.MaxPerGroup < 1 || cfg.MaxConcurrent < cfg.MaxPerGroup:
		return fmt.Errorf("checkback: MaxPerGroup %d must be at least 1 and at most MaxConcurrent %d", cfg.MaxPerGroup, cfg.MaxConcurrent)
	case cfg.MaxProposals < 1:
		return fmt.Errorf("checkback: MaxProposals %d must be at least 1", cfg.MaxProposals)
	case cfg.Lease < cfg.HeartbeatInterval:
		return fmt.Errorf("checkback: Lease %s is shorter than HeartbeatInterval %s", cfg.Lease, cfg.HeartbeatInterval)
	}
	return nil
}

// Errors of CheckNow.
var (
	// ErrNotPending: the message is resolved or expired; it is not checked.
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

// Policy is the check-back policy in force for a group.
func (s *Scheduler) Policy(tx Schedule, group string) (Policy, error) {
	pg, err := tx.ProducerGroup(group)
	if err != nil {
		return Policy{}, err
	}
	return s.policyOf(pg), nil
}

func (s *Scheduler) policyOf(pg *storepb.ProducerGroup) Policy {
	p := s.cfg.Policy
	if pg.MaxChecks > 0 {
		p.MaxChecks = pg.MaxChecks
	}
	if pg.CheckBackoff > 0 {
		p.Backoff = time.Duration(pg.CheckBackoff)
	}
	if pg.MaxCheckBackoff > 0 {
		p.MaxBackoff = time.Duration(pg.MaxCheckBackoff)
	}
	p.MaxBackoff = max(p.MaxBackoff, p.Backoff)
	if pg.MaxHalfAge > 0 {
		p.MaxHalfAge = time.Duration(pg.MaxHalfAge)
	}
	switch pg.ExpiryAction {
	case storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK:
		p.Rollback = true
	case storepb.ExpiryAction_EXPIRY_ACTION_PARK:
		p.Rollback = false
	}
	if pg.CallbackUrl != "" {
		if ep, err := ParseEndpoint(pg.CallbackUrl); err == nil {
			p.Callback = ep
		}
	}
	return p
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

// Outcome is what one check-back found.
type Outcome struct {
	Answer   txmqv1.Resolution // UNSPECIFIED when there was no answer
	Instance string
	Endpoint string
	Err      error
	// Reached: the check got to a producer (counts against max_checks).
	Reached bool
}

// process handles one due message: expire it, or check it and apply the
// answer. It gives back the call slot (called) before it proposes.
func (s *Scheduler) process(ctx context.Context, h *storepb.Half, pol Policy) {
	now := s.cfg.Now()
	if s.tooOld(h, pol, now) {
		s.called(h)
		s.expire(ctx, h, pol, "older than max_half_age")
		return
	}
	if h.CheckAttempts >= pol.MaxChecks {
		s.called(h)
		s.expire(ctx, h, pol, "check-backs used up")
		return
	}
	out := s.call(ctx, h, pol)
	s.called(h)
	if ctx.Err() != nil {
		return
	}
	s.apply(ctx, h, pol, out)
}

// call asks one live instance of the group (round robin), or the group's
// static callback.
func (s *Scheduler) call(ctx context.Context, h *storepb.Half, pol Policy) Outcome {
	var out Outcome
	ep := pol.Callback
	if in, ok := s.reg.Pick(h.ProducerGroup); ok {
		ep, out.Instance = in.Endpoint, in.ID
	}
	if ep.IsZero() {
		out.Err = fmt.Errorf("%w: no instance of producer group %q is registered", ErrNotReached, h.ProducerGroup)
		s.observe(h.ProducerGroup, "no_instance", 0)
		return out
	}
	start := s.cfg.Now()
	defer func() { s.observe(h.ProducerGroup, result(out), s.cfg.Now().Sub(start)) }()
	out.Endpoint = ep.String()
	cctx, cancel := context.WithTimeout(ctx, s.cfg.CallTimeout)
	defer cancel()
	ans, err := s.cfg.Caller.Check(cctx, ep, &txmqv1.CheckTransactionRequest{
		MessageId:     h.Id,
		Topic:         h.Topic,
		ProducerGroup: h.ProducerGroup,
		TransactionId: h.TransactionId,
		Key:           h.Key,
		Properties:    h.Properties,
		Body:          h.Body,
		Attempt:       h.CheckAttempts + 1,
		CreatedAt:     timestamppb.New(time.Unix(0, h.CreatedAt)),
	})
	out.Reached = !errors.Is(err, ErrNotReached)
	if err != nil {
		if cctx.Err() == context.DeadlineExceeded && ctx.Err() == nil {
			err = fmt.Errorf("no answer within %s: %w", s.cfg.CallTimeout, err)
		}
		out.Err = err
		return out
	}
	out.Answer = ans
	return out
}

func (s *Scheduler) observe(group, result string, took time.Duration) {
	if s.cfg.Observe != nil {
		s.cfg.Observe(group, result, took)
	}
}

// result names an outcome for metrics.
func result(out Outcome) string {
	switch {
	case out.Err == nil && out.Answer == txmqv1.Resolution_RESOLUTION_COMMIT:
		return "commit"
	case out.Err == nil && out.Answer == txmqv1.Resolution_RESOLUTION_ROLLBACK:
		return "rollback"
	case out.Err == nil:
		return "unknown"
	case !out.Reached:
		return "not_reached"
	case errors.Is(out.Err, context.DeadlineExceeded):
		return "timeout"
	}
	return "error"
}

// apply proposes what an outcome means for the message.
func (s *Scheduler) apply(ctx context.Context, h *storepb.Half, pol Policy, out Outcome) {
	log := s.log.With("msg_id", h.Id, "tx_id", h.TransactionId, "producer_group", h.ProducerGroup, "topic", h.Topic,
		"instance", out.Instance, "attempt", h.CheckAttempts+1)
	var res raftpb.Resolution
	switch out.Answer {
	case txmqv1.Resolution_RESOLUTION_COMMIT:
		res = raftpb.Resolution_RESOLUTION_COMMIT
	case txmqv1.Resolution_RESOLUTION_ROLLBACK:
		res = raftpb.Resolution_RESOLUTION_ROLLBACK
	}
	if res != raftpb.Resolution_RESOLUTION_UNSPECIFIED {
		_, err := s.prop.Resolve(ctx, s.cfg.Now(), &raftpb.Resolve{
			MessageId: h.Id, Resolution: res, Source: storepb.Source_SOURCE_CHECKBACK,
		})
		switch {
		case err == nil:
			log.Info("check-back resolved half message", "resolution", res.String())
		case errors.Is(err, raftlog.ErrRefused):
			log.Info("check-back answer arrived after the message was resolved; nothing changes", "answer", res.String(), "err", err)
		default:
			log.Warn("check-back answer not applied; the message will be checked again", "err", err)
		}
		return
	}

	now := s.cfg.Now()
	attempts := h.CheckAttempts
	if out.Reached {
		attempts++
	}
	errMsg := "answered UNKNOWN"
	if out.Err != nil {
		errMsg = out.Err.Error()
	}
	var delay time.Duration
	if attempts == 0 {
		delay = pol.Backoff
	} else {
		delay = pol.Backoff << min(attempts-1, 30)
	}
	delay = time.Duration(float64(min(delay, pol.MaxBackoff)) * s.cfg.Jitter())
	next := now.Add(delay)
	if deadline := time.Unix(0, h.CreatedAt).Add(pol.MaxHalfAge); next.After(deadline) {
		next = deadline
	}
	_, err := s.prop.RecordCheck(ctx, now, &raftpb.RecordCheck{
		MessageId: h.Id, Reached: out.Reached, Error: errMsg, NextCheckAt: next.UnixNano(),
	})
	if err != nil {
		if !errors.Is(err, raftlog.ErrRefused) {
			log.Warn("check-back outcome not recorded", "err", err)
		}
		return
	}
	log.Info("check-back unresolved", "reason", errMsg, "reached", out.Reached, "next_check_at", next)
	if attempts >= pol.MaxChecks {
		s.expire(ctx, h, pol, fmt.Sprintf("%d check-backs got no resolution", attempts))
	}
}

func (s *Scheduler) expire(ctx context.Context, h *storepb.Half, pol Policy, why string) {
	_, err := s.prop.Expire(ctx, s.cfg.Now(), &raftpb.Expire{MessageId: h.Id, Rollback: pol.Rollback})
	log := s.log.With("msg_id", h.Id, "tx_id", h.TransactionId, "producer_group", h.ProducerGroup, "topic", h.Topic)
	switch {
	case err == nil && pol.Rollback:
		log.Warn("half message expired and rolled back", "why", why, "attempts", h.CheckAttempts)
	case err == nil:
		log.Warn("half message expired; parked for an operator (brokerctl half list --state expired)", "why", why, "attempts", h.CheckAttempts)
	case errors.Is(err, raftlog.ErrRefused):
	default:
		log.Warn("expiry not applied; will retry", "err", err)
	}
}

// CheckNow checks one pending message at once (brokerctl half check) and
// applies the answer like a scheduled check. It returns the outcome and the
// message as it is afterwards.
func (s *Scheduler) CheckNow(ctx context.Context, id string) (Outcome, *storepb.Half, error) {
	var h *storepb.Half
	var pol Policy
	err := s.store.ReadSchedule(func(tx Schedule) error {
		var err error
		if h, err = tx.Half(id); err != nil {
			return err
		}
		pol, err = s.Policy(tx, h.ProducerGroup)
		return err
	})
	if err != nil {
		return Outcome{}, nil, err
	}
	if h.State != storepb.HalfState_HALF_STATE_PENDING {
		return Outcome{}, h, fmt.Errorf("%w: half message %s is %s; only pending messages are checked", ErrNotPending, id, halfstore.StateName(h.State))
	}
	if !s.claim(h) {
		return Outcome{}, h, fmt.Errorf("%w: a check of half message %s is already running", ErrCheckRunning, id)
	}
	defer s.release(h)
	out := s.call(ctx, h, pol)
	s.called(h)
	if ctx.Err() != nil {
		return out, h, ctx.Err()
	}
	s.apply(ctx, h, pol, out)
	err = s.store.ReadSchedule(func(tx Schedule) error {
		var err error
		h, err = tx.Half(id)
		return err
	})
	return out, h, err
}
