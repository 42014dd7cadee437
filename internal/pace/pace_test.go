package pace

import (
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

func timerFor(t testing.TB) *Timer {
	t.Helper()
	tm, err := New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tm.Close() })
	return tm
}

func TestUntilNeverReturnsEarly(t *testing.T) {
	tm := timerFor(t)
	for range 300 {
		at := time.Now().Add(time.Duration(rand.Int64N(int64(2 * time.Millisecond))))
		if err := tm.Until(at); err != nil {
			t.Fatal(err)
		}
		if now := time.Now(); now.Before(at) {
			t.Fatalf("returned %v before %v", at.Sub(now), at)
		}
	}
}

func TestUntilAPastTimeReturnsAtOnce(t *testing.T) {
	tm := timerFor(t)
	// A timer set to zero would be disarmed and never fire: a past time
	// must not reach it.
	for _, at := range []time.Time{time.Now(), time.Now().Add(-time.Hour), {}} {
		if err := tm.Until(at); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUntilAfterCloseFails(t *testing.T) {
	tm, err := New()
	if err != nil {
		t.Fatal(err)
	}
	if err := tm.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tm.Until(time.Now().Add(time.Millisecond)); err == nil && runtime.GOOS == "linux" {
		t.Fatal("Until on a closed timer succeeded")
	}
}

// BenchmarkLateness wakes on a schedule of one slot every 500 µs, as the
// e2e workloads do at 2,000/s, and reports how late the wake-ups were:
// go test -run '^$' -bench Lateness ./internal/pace
func BenchmarkLateness(b *testing.B) {
	tm := timerFor(b)
	for _, c := range []struct {
		name  string
		until func(time.Time) error
	}{
		{"pace", tm.Until},
		{"time.Sleep", func(at time.Time) error { time.Sleep(time.Until(at)); return nil }},
	} {
		b.Run(c.name, func(b *testing.B) {
			late := make([]time.Duration, 0, b.N)
			first := time.Now().Add(time.Millisecond)
			for i := range b.N {
				at := first.Add(time.Duration(i) * 500 * time.Microsecond)
				if err := c.until(at); err != nil {
					b.Fatal(err)
				}
				late = append(late, time.Since(at))
			}
			slices.Sort(late)
			for _, q := range []struct {
				unit string
				p    int
			}{{"p50-late-µs", 50}, {"p90-late-µs", 90}, {"p99-late-µs", 99}} {
				b.ReportMetric(float64(late[(len(late)-1)*q.p/100].Microseconds()), q.unit)
			}
		})
	}
}
