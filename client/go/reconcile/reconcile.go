// Package reconcile is the last fuse of eventual consistency: a periodic
// job that compares what should have happened (paid orders) with what did
// happen (points credited) over a time window, and emits a compensation for
// each fact that is missing, a reversal for each fact that should not be
// there (points without an order), and reports what it cannot fix.
//
// Messages and idempotent consumers keep the normal case right; this job
// finds what slipped through anyway: a consumer bug, a row deleted by hand,
// a check-back that answered from a cache. Its actions have IDs of their
// own, "compensate:<type>:<biz id>:<attempt>" and
// "reverse:<type>:<biz id>:<attempt>", never the original message's, so the
// consumer's idempotency record (ProcessOnce) does not swallow them. Send
// them with the ID as the message key, so that a retry of the same action
// is deduplicated by the broker.
package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrInvalid: a configuration the job cannot use.
var ErrInvalid = errors.New("reconcile: invalid")

// Item is one fact on one side, keyed by its business ID.
type Item struct {
	// ID is the business key both sides share, e.g. the order ID.
	ID string
	// Value is compared when both sides have the item, e.g. the points:
	// items whose values differ are mismatches, reported, not acted on.
	Value string
}

// Window is the time range a run looks at: From inclusive, To exclusive.
type Window struct{ From, To time.Time }

// Action kinds.
const (
	Compensate = "compensate"
	Reverse    = "reverse"
)

// Action is a compensation or a reversal to emit.
type Action struct {
	// ID is Kind:Type:BizID:Attempt, distinct from the original message's
	// ID and from the same item's earlier actions.
	ID      string
	Kind    string
	Type    string
	BizID   string
	Attempt int
	// Expected is the fact that should be there (for a compensation);
	// Actual the one that should not (for a reversal).
	Expected, Actual *Item
}

// Mismatch is a difference the job does not fix by itself.
type Mismatch struct {
	BizID            string
	Expected, Actual *Item
	Reason           string
}

// Config configures a Job.
type Config struct {
	// Type names what is reconciled, in action IDs and metric labels, e.g.
	// "order_paid". Required.
	Type string
	// Expected lists what should have happened in the window: the paid
	// orders. Required.
	Expected func(ctx context.Context, w Window) ([]Item, error)
	// Actual lists what did happen in the window: the orders with points.
	// Required.
	Actual func(ctx context.Context, w Window) ([]Item, error)
	// Compensate emits an action for an expected item with no actual one.
	// Required.
	Compensate func(ctx context.Context, a Action) error
	// Reverse emits an action for an actual item with no expected one.
	// Optional: without it such items are reported as mismatches.
	Reverse func(ctx context.Context, a Action) error
	// Interval is the time between runs. Default 5 min.
	Interval time.Duration
	// Window is how far back a run looks. Default 24 h.
	Window time.Duration
	// Grace leaves the newest part of the window out, where messages may
	// still be on their way: make it several times the end-to-end P99.
	// Default 1 min.
	Grace time.Duration
	// Settle is how long after an action on an item the job waits for it
	// to take effect before it acts on the item again, with the next
	// attempt; it doubles with each attempt (up to Window), so that an item
	// that stays wrong, because its consumer is down, say, is not flooded
	// with compensations. Default twice Interval.
	Settle time.Duration
	// Logger receives the job's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets txmq_reconcile_runs_total,
	// txmq_reconcile_actions_total{kind}, txmq_reconcile_action_errors_total,
	// txmq_reconcile_mismatches,
	// txmq_reconcile_run_duration_seconds, each with a type label.
	Registerer prometheus.Registerer
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Job runs reconciliation. Attempts are counted in memory: after a restart
// they count from 1 again, and an action whose ID an earlier process used
// is swallowed by the consumer's record; the next run after Settle then
// emits the next attempt.
type Job struct {
	run     sync.Mutex // one run at a time: RunOnce may be called beside Run
	cfg     Config
	log     *slog.Logger
	m       *metrics
	attempt map[string]int       // kind:biz id → last attempt emitted
	settle  map[string]time.Time // kind:biz id → when it may be acted on again
}

// New checks cfg and fills in its defaults.
func New(cfg Config) (*Job, error) {
	switch {
	case cfg.Type == "":
		return nil, fmt.Errorf("%w: Config.Type is empty", ErrInvalid)
	case cfg.Expected == nil || cfg.Actual == nil || cfg.Compensate == nil:
		return nil, fmt.Errorf("%w: Config needs Expected, Actual and Compensate", ErrInvalid)
	case cfg.Interval < 0 || cfg.Window < 0 || cfg.Grace < 0 || cfg.Settle < 0:
		return nil, fmt.Errorf("%w: Config durations may not be negative", ErrInvalid)
	}
	if cfg.Interval == 0 {
		cfg.Interval = 5 * time.Minute
	}
	if cfg.Window == 0 {
		cfg.Window = 24 * time.Hour
	}
	if cfg.Grace == 0 {
		cfg.Grace = time.Minute
	}
	if cfg.Settle == 0 {
		cfg.Settle = 2 * cfg.Interval
	}
	if cfg.Grace >= cfg.Window {
		return nil, fmt.Errorf("%w: Config.Grace %v leaves nothing of Window %v", ErrInvalid, cfg.Grace, cfg.Window)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := newMetrics(cfg.Type)
	if cfg.Registerer != nil {
		if err := m.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("reconcile: register metrics: %w", err)
		}
	}
	return &Job{cfg: cfg, log: cfg.Logger.With("component", "txmq-reconcile", "type", cfg.Type), m: m,
		attempt: map[string]int{}, settle: map[string]time.Time{}}, nil
}

// Run runs the job every Interval until ctx ends, first at once. A failed
// run is logged; the next one tries again. It returns nil when ctx ends.
func (j *Job) Run(ctx context.Context) error {
	t := time.NewTicker(j.cfg.Interval)
	defer t.Stop()
	for {
		if _, err := j.RunOnce(ctx); err != nil && ctx.Err() == nil {
			j.log.Error("reconciliation run failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Report is what a run found and did.
type Report struct {
	Window           Window
	Expected, Actual int
	// Actions were emitted; Settling items were left alone, their last
	// action being younger than Settle.
	Actions  []Action
	Settling int
	// Mismatches the job could not fix, and actions that failed to emit
	// (tried again next run, with the same ID).
	Mismatches []Mismatch
	Failed     int
}

// RunOnce reconciles the window [now-Window, now-Grace) once.
func (j *Job) RunOnce(ctx context.Context) (Report, error) {
	j.run.Lock()
	defer j.run.Unlock()
	start := j.cfg.Now()
	defer func() { j.m.duration.Observe(time.Since(start).Seconds()) }()
	w := Window{From: start.Add(-j.cfg.Window), To: start.Add(-j.cfg.Grace)}
	rep := Report{Window: w}
	expected, err := j.cfg.Expected(ctx, w)
	if err != nil {
		return rep, fmt.Errorf("reconcile %s: expected: %w", j.cfg.Type, err)
	}
	actual, err := j.cfg.Actual(ctx, w)
	if err != nil {
		return rep, fmt.Errorf("reconcile %s: actual: %w", j.cfg.Type, err)
	}
	rep.Expected, rep.Actual = len(expected), len(actual)
	have := make(map[string]Item, len(actual))
	for _, it := range actual {
		have[it.ID] = it
	}
	want := make(map[string]bool, len(expected))
	for _, e := range expected {
		want[e.ID] = true
		a, ok := have[e.ID]
		switch {
		case !ok:
			j.act(ctx, &rep, start, Compensate, e.ID, &e, nil, j.cfg.Compensate)
		case a.Value != e.Value:
			rep.Mismatches = append(rep.Mismatches, Mismatch{BizID: e.ID, Expected: &e, Actual: &a,
				Reason: fmt.Sprintf("expected %q, found %q", e.Value, a.Value)})
		}
	}
	for _, a := range actual {
		if want[a.ID] {
			continue
		}
		if j.cfg.Reverse == nil {
			rep.Mismatches = append(rep.Mismatches, Mismatch{BizID: a.ID, Actual: &a, Reason: "no expected fact, and no Reverse"})
			continue
		}
		j.act(ctx, &rep, start, Reverse, a.ID, nil, &a, j.cfg.Reverse)
	}
	j.finish(rep)
	return rep, nil
}

// act emits an action for an item unless its last one is still settling.
func (j *Job) act(ctx context.Context, rep *Report, now time.Time, kind, bizID string, exp, act *Item, emit func(context.Context, Action) error) {
	key := kind + ":" + bizID
	if until, ok := j.settle[key]; ok && now.Before(until) {
		rep.Settling++
		return
	}
	n := j.attempt[key] + 1
	a := Action{ID: fmt.Sprintf("%s:%s:%s:%d", kind, j.cfg.Type, bizID, n), Kind: kind, Type: j.cfg.Type,
		BizID: bizID, Attempt: n, Expected: exp, Actual: act}
	if err := emit(ctx, a); err != nil {
		// The same ID next run: the broker's dedup key makes a repeat of
		// an action that did get through harmless.
		rep.Failed++
		j.m.failed.Inc()
		j.log.Warn("reconciliation action failed; trying again next run", "action", a.ID, "err", err)
		return
	}
	j.attempt[key] = n
	j.settle[key] = now.Add(settleAfter(j.cfg.Settle, j.cfg.Window, n))
	rep.Actions = append(rep.Actions, a)
	j.m.actions.WithLabelValues(kind).Inc()
	j.log.Info("reconciliation action emitted", "action", a.ID, "kind", kind, "biz_id", bizID, "attempt", n)
}

// settleAfter is Settle doubled for each attempt after the first, capped
// at window.
func settleAfter(settle, window time.Duration, attempt int) time.Duration {
	d := settle
	for i := 1; i < attempt && d < window; i++ {
		d *= 2
	}
	return min(d, window)
}

func (j *Job) finish(rep Report) {
	j.m.runs.Inc()
	j.m.mismatches.Set(float64(len(rep.Mismatches)))
	for _, m := range rep.Mismatches {
		j.log.Error("reconciliation mismatch it cannot fix", "biz_id", m.BizID, "reason", m.Reason)
	}
	// Forget settled items that are consistent again, so the maps follow
	// what is wrong, not everything that ever was.
	acted := map[string]bool{}
	for _, a := range rep.Actions {
		acted[a.Kind+":"+a.BizID] = true
	}
	now := j.cfg.Now()
	for key, until := range j.settle {
		if !acted[key] && now.After(until.Add(j.cfg.Window)) {
			delete(j.settle, key)
			delete(j.attempt, key)
		}
	}
	j.log.Info("reconciliation run", "from", rep.Window.From, "to", rep.Window.To, "expected", rep.Expected,
		"actual", rep.Actual, "actions", len(rep.Actions), "settling", rep.Settling,
		"mismatches", len(rep.Mismatches), "failed", rep.Failed)
}

type metrics struct {
	runs       prometheus.Counter
	actions    *prometheus.CounterVec
	failed     prometheus.Counter
	mismatches prometheus.Gauge
	duration   prometheus.Histogram
}

func newMetrics(typ string) *metrics {
	l := prometheus.Labels{"type": typ}
	return &metrics{
		runs: prometheus.NewCounter(prometheus.CounterOpts{Name: "txmq_reconcile_runs_total",
			Help: "Reconciliation runs that completed.", ConstLabels: l}),
		actions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "txmq_reconcile_actions_total",
			Help: "Compensations and reversals emitted.", ConstLabels: l}, []string{"kind"}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "txmq_reconcile_action_errors_total",
			Help: "Actions that failed to emit, tried again next run.", ConstLabels: l}),
		mismatches: prometheus.NewGauge(prometheus.GaugeOpts{Name: "txmq_reconcile_mismatches",
			Help: "Differences the last run found and could not fix: alert on > 0.", ConstLabels: l}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "txmq_reconcile_run_duration_seconds",
			Help: "Duration of one reconciliation run.", ConstLabels: l, Buckets: prometheus.ExponentialBuckets(0.001, 4, 9)}),
	}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.runs, m.actions, m.failed, m.mismatches, m.duration} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
