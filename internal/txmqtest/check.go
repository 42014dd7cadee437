package txmqtest

import (
	"testing"
	"time"
)

// CheckFor calls f every interval until it returns nil, and fails the test
// with f's last error once timeout has passed. It is how tests wait for
// something to happen: never a bare sleep.
func CheckFor(t testing.TB, timeout, every time.Duration, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %v", timeout, err)
		}
		time.Sleep(every)
	}
}
