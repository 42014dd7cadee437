package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary be measureRoundTrip's echo child, as the
// bench binary is.
func TestMain(m *testing.M) {
	if os.Getenv(echoEnv) != "" {
		os.Exit(echo(os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestRoundTripProbe times round trips to a child process: every one is
// counted, back to back and idle, each took some time, and the child is
// gone when it returns.
func TestRoundTripProbe(t *testing.T) {
	hot, idle, err := measureRoundTrip(50)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []summary{hot, idle} {
		if s.Count != 50 || s.P50 <= 0 || s.Max < s.P50 {
			t.Fatalf("want 50 round trips with times, got %+v", s)
		}
	}
}
