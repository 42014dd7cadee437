package bounds

import (
	"testing"
	"time"
)

func TestRangeCheck(t *testing.T) {
	r := Range[time.Duration]{time.Second, time.Hour}
	for _, ok := range []time.Duration{time.Second, time.Minute, time.Hour} {
		if err := r.Check("--x", ok); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for _, bad := range []time.Duration{0, time.Second - 1, time.Hour + 1} {
		err := r.Check("--x", bad)
		if err == nil {
			t.Fatalf("%s accepted", bad)
		}
		if want := "--x " + bad.String() + " is outside 1s..1h0m0s"; err.Error() != want {
			t.Errorf("got %q, want %q", err, want)
		}
	}
}
