package reconcile

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// Run's loop must end with its context.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sides is an in-memory "what should have happened" and "what did".
type sides struct {
	mu       sync.Mutex
	expected map[string]string
	actual   map[string]string
	emitted  []Action
	fail     error
}

func items(m map[string]string) []Item {
	var out []Item
	for id, v := range m {
		out = append(out, Item{ID: id, Value: v})
	}
	return out
}

func (s *sides) config(now *time.Time) Config {
	return Config{
		Type: "order_paid",
		Expected: func(context.Context, Window) ([]Item, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return items(s.expected), nil
		},
		Actual: func(context.Context, Window) ([]Item, error) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return items(s.actual), nil
		},
		Compensate: func(_ context.Context, a Action) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.fail != nil {
				return s.fail
			}
			s.emitted = append(s.emitted, a)
			return nil
		},
		Reverse: func(_ context.Context, a Action) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.emitted = append(s.emitted, a)
			return nil
		},
		Interval: time.Minute,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Now:      func() time.Time { return *now },
	}
}

// value reads a counter or a gauge.
func value(t *testing.T, m prometheus.Metric) float64 {
	var out dto.Metric
	require.NoError(t, m.Write(&out))
	if c := out.GetCounter(); c != nil {
		return c.GetValue()
	}
	return out.GetGauge().GetValue()
}

func ids(as []Action) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.ID)
	}
	return out
}

func TestCompensationsAndReversals(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := &sides{
		expected: map[string]string{"order-1": "120", "order-2": "80", "order-3": "50"},
		actual:   map[string]string{"order-1": "120", "order-3": "40", "ghost-9": "300"},
	}
	cfg := s.config(&now)
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	j, err := New(cfg)
	require.NoError(t, err)

	rep, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, Window{From: now.Add(-24 * time.Hour), To: now.Add(-time.Minute)}, rep.Window)
	require.Equal(t, []string{"compensate:order_paid:order-2:1", "reverse:order_paid:ghost-9:1"}, ids(rep.Actions))
	require.Equal(t, "80", rep.Actions[0].Expected.Value)
	require.Equal(t, "300", rep.Actions[1].Actual.Value)
	require.Len(t, rep.Mismatches, 1)
	require.Equal(t, "order-3", rep.Mismatches[0].BizID)
	require.Equal(t, 1.0, value(t, j.m.mismatches))
	require.Equal(t, 1.0, value(t, j.m.actions.WithLabelValues(Compensate)))

	// Within Settle (2 min) nothing is emitted again.
	now = now.Add(time.Minute)
	rep, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Empty(t, rep.Actions)
	require.Equal(t, 2, rep.Settling)

	// The compensation took effect; the reversal did not: the next attempt
	// has an ID of its own.
	s.mu.Lock()
	s.actual["order-2"] = "80"
	s.mu.Unlock()
	now = now.Add(2 * time.Minute)
	rep, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"reverse:order_paid:ghost-9:2"}, ids(rep.Actions))
	require.Len(t, s.emitted, 3)

	// The second attempt settles twice as long: 4 min.
	now = now.Add(3 * time.Minute)
	rep, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Empty(t, rep.Actions)
	now = now.Add(time.Minute)
	rep, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"reverse:order_paid:ghost-9:3"}, ids(rep.Actions))
	require.Equal(t, 10*time.Minute, settleAfter(time.Minute, 10*time.Minute, 9), "capped at the window")
}

func TestFailedActionKeepsItsID(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	s := &sides{expected: map[string]string{"order-1": "120"}, actual: map[string]string{}, fail: errors.New("broker down")}
	j, err := New(s.config(&now))
	require.NoError(t, err)
	rep, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, rep.Failed)
	require.Empty(t, rep.Actions)

	s.fail = nil
	rep, err = j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, []string{"compensate:order_paid:order-1:1"}, ids(rep.Actions), "not settling, and the same attempt")
}

func TestConfigChecks(t *testing.T) {
	now := time.Now()
	s := &sides{}
	for name, mutate := range map[string]func(*Config){
		"no type":         func(c *Config) { c.Type = "" },
		"no compensate":   func(c *Config) { c.Compensate = nil },
		"grace >= window": func(c *Config) { c.Grace, c.Window = time.Hour, time.Hour },
		"negative":        func(c *Config) { c.Settle = -1 },
	} {
		cfg := s.config(&now)
		mutate(&cfg)
		_, err := New(cfg)
		require.ErrorIs(t, err, ErrInvalid, name)
	}
	cfg := s.config(&now)
	cfg.Reverse = nil
	s.actual = map[string]string{"ghost": "1"}
	j, err := New(cfg)
	require.NoError(t, err)
	rep, err := j.RunOnce(t.Context())
	require.NoError(t, err)
	require.Len(t, rep.Mismatches, 1, "without Reverse a fact that should not be there is reported")
}

// Run runs at once and then every Interval, and stops with its context.
func TestRunStopsWithContext(t *testing.T) {
	s := &sides{expected: map[string]string{}, actual: map[string]string{}}
	now := time.Now()
	cfg := s.config(&now)
	cfg.Now = nil
	cfg.Interval = 10 * time.Millisecond
	j, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- j.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for value(t, j.m.runs) < 3 {
		require.True(t, time.Now().Before(deadline), "three runs within 10 s")
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
}
