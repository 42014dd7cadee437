//go:build !linux

package pace

import "time"

// timer is time.Sleep where there is no timerfd.
type timer struct{}

func newTimer() (timer, error) { return timer{}, nil }

func (timer) sleep(d time.Duration) error {
	time.Sleep(d)
	return nil
}

func (timer) close() error { return nil }
