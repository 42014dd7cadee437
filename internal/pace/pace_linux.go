package pace

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// timer is a timerfd, non-blocking, so that os.File reads it through the
// runtime's poller.
type timer struct {
	fd int
	f  *os.File
}

func newTimer() (timer, error) {
	fd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_NONBLOCK|unix.TFD_CLOEXEC)
	if err != nil {
		return timer{}, fmt.Errorf("pace: timerfd_create: %w", err)
	}
	return timer{fd: fd, f: os.NewFile(uintptr(fd), "timerfd")}, nil
}

func (t timer) sleep(d time.Duration) error {
	if err := unix.TimerfdSettime(t.fd, 0, &unix.ItimerSpec{Value: unix.NsecToTimespec(int64(d))}, nil); err != nil {
		return fmt.Errorf("pace: timerfd_settime: %w", err)
	}
	// The expirations since the timer was set: one.
	var n [8]byte
	if _, err := t.f.Read(n[:]); err != nil {
		return fmt.Errorf("pace: read timerfd: %w", err)
	}
	return nil
}

func (t timer) close() error { return t.f.Close() }
