package txmq

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/status"
)

const (
	retryBaseDelay = 50 * time.Millisecond
	retryMaxDelay  = time.Second
)

// pacer paces the tries of one call: capped exponential backoff with
// jitter, until RetryTimeout has passed or ctx's deadline would.
type pacer struct {
	delay    time.Duration
	deadline time.Time
	timeout  time.Duration
	// byCtx says that the deadline is ctx's, which comes before
	// RetryTimeout's.
	byCtx bool
}

func (c *Conn) newPacer(ctx context.Context) *pacer {
	p := &pacer{delay: retryBaseDelay, deadline: time.Now().Add(c.retryTimeout), timeout: c.retryTimeout}
	if d, ok := ctx.Deadline(); ok && !d.After(p.deadline) {
		p.deadline, p.byCtx = d, true
	}
	return p
}

// next returns how long to wait before the next try, none when now, or the
// error to give up with when that try would come too late. last is the
// Unavailable answer of the try before.
func (p *pacer) next(now bool, last *status.Status) (time.Duration, error) {
	var wait time.Duration
	if !now {
		wait = p.delay/2 + rand.N(p.delay/2+1)
		p.delay = min(2*p.delay, retryMaxDelay)
	}
	if !time.Now().Add(wait).After(p.deadline) {
		return wait, nil
	}
	if p.byCtx {
		return 0, giveUp(last, "gave up retrying: "+context.DeadlineExceeded.Error(), context.DeadlineExceeded)
	}
	return 0, giveUp(last, fmt.Sprintf("gave up after retrying for %v", p.timeout), nil)
}

// sleep waits for d or until ctx ends, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
