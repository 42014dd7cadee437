package checkback

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/bounds"
)

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

// Defaults (docs/semantics.md, Defaults).
const (
	DefaultMaxChecks         = 15
	DefaultBackoff           = 6 * time.Second
	DefaultMaxBackoff        = 60 * time.Second
	DefaultMaxHalfAge        = 24 * time.Hour
	DefaultCallTimeout       = 3 * time.Second
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultLease             = 10 * time.Second
	// DefaultMaxConcurrent and DefaultMaxPerGroup bound the calls to
	// producers in flight, in all and per producer group. 64 per group,
	// spread over the group's instances, and twice that in all: with 8,
	// one group's resolutions waited for its call slots (2,200–2,800/s on
	// three broker processes; 5,300–6,400/s with 32 of 64, 6,600–7,200/s
	// with 64 of 128; docs/decisions.md, Check-back).
	DefaultMaxConcurrent = 128
	DefaultMaxPerGroup   = 64
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
	// Guard decides which addresses the default Caller may call; nil
	// allows DefaultCallbackAllow.
	Guard *Guard
	// TLS, when set and Caller is not, is the default caller's client
	// side: the CA bundle of --callback-ca and a client certificate
	// (NewTLSCaller).
	TLS *tls.Config
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
		cfg.Caller = NewTLSCaller(cfg.Guard, cfg.TLS)
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
