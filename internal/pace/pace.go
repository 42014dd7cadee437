// Package pace wakes a goroutine at a point in time to within tens of
// microseconds, for the benches' open loops, whose latencies run from
// each operation's scheduled time.
//
// time.Sleep is not that precise when the process has nothing else to
// do: the Go runtime then waits for its timers in epoll_wait, whose
// timeout is in whole milliseconds, and rounds a shorter wait up to one
// millisecond. A schedule of a write every half millisecond then starts
// its writes half a millisecond late at the median and a millisecond at
// the p90 (BenchmarkLateness), and a latency measured from the schedule
// counts that against the system under test. On Linux a Timer is a
// timerfd, read through the runtime's network poller: epoll_wait returns
// as soon as the timer expires, whatever its timeout.
package pace

import "time"

// A Timer sleeps one goroutine at a time; give each goroutine that
// sleeps its own.
type Timer struct {
	t timer
}

// New returns a Timer; Close releases it.
func New() (*Timer, error) {
	t, err := newTimer()
	if err != nil {
		return nil, err
	}
	return &Timer{t: t}, nil
}

// Until returns at at, or at once if at has passed.
func (t *Timer) Until(at time.Time) error {
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	return t.t.sleep(d)
}

// Close releases the timer.
func (t *Timer) Close() error { return t.t.close() }
