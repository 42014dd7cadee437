// Package bounds holds the allowed range of each txmq setting, so that the
// broker's flags and Config, the admin API and the check-back scheduler
// refuse the same values with the same words.
package bounds

import (
	"cmp"
	"fmt"
	"time"
)

// Range is the closed interval a setting must lie in.
type Range[T cmp.Ordered] struct {
	Min, Max T
}

// Check refuses a value outside the range, naming the setting as the
// caller spells it (a flag, a Config field, an API field).
func (r Range[T]) Check(name string, v T) error {
	if v < r.Min || v > r.Max {
		return fmt.Errorf("%s %v is outside %v..%v", name, v, r.Min, r.Max)
	}
	return nil
}

// Consumer group delivery settings.
var (
	AckDeadline   = Range[time.Duration]{time.Second, 12 * time.Hour}
	MaxDeliveries = Range[uint32]{1, 1000}
	// RedeliveryStep bounds each step of a redelivery backoff, a nack's
	// delay and a deadline extension.
	RedeliveryStep = Range[time.Duration]{0, 12 * time.Hour}
	// BackoffSteps bounds the number of steps of a redelivery backoff.
	BackoffSteps = Range[int]{1, 100}
	// Extension bounds a deadline extension.
	Extension = Range[time.Duration]{time.Second, 12 * time.Hour}
)

// Broker settings.
var (
	Retention         = Range[time.Duration]{time.Second, 100 * 365 * 24 * time.Hour}
	RetentionInterval = Range[time.Duration]{10 * time.Millisecond, time.Hour}
	// DedupWindow: 0 is off.
	DedupWindow = Range[time.Duration]{0, 30 * 24 * time.Hour}
	// MessageSize bounds the configured largest body.
	MessageSize       = Range[int]{1, 64 << 20}
	SnapshotInterval  = Range[time.Duration]{time.Second, 24 * time.Hour}
	SnapshotThreshold = Range[uint64]{16, 1 << 30}
)

// Half message and check-back settings.
var (
	CheckAfter      = Range[time.Duration]{time.Second, time.Hour}
	MaxChecks       = Range[uint32]{1, 1000}
	CheckBackoff    = Range[time.Duration]{100 * time.Millisecond, time.Hour}
	MaxCheckBackoff = Range[time.Duration]{100 * time.Millisecond, 24 * time.Hour}
	MaxHalfAge      = Range[time.Duration]{time.Second, 30 * 24 * time.Hour}
	// CallTimeout bounds one call to a producer.
	CallTimeout = Range[time.Duration]{10 * time.Millisecond, 5 * time.Minute}
	// Concurrency bounds the check-backs in flight (in all, per group).
	Concurrency = Range[int]{1, 10000}
)
