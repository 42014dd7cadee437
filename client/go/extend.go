package txmq

// Deadline extensions: Delivery.Extend, and the loop that extends the
// deadlines of deliveries whose handlers are still running.

import (
	"context"
	"fmt"
	"time"
)

// extend sends an extension of t's deadline for Delivery.Extend.
func (s *session) extend(ctx context.Context, t *tracked, extension time.Duration) error {
	s.mu.Lock()
	if t.settled {
		s.mu.Unlock()
		return fmt.Errorf("txmq: delivery %s is already acked or nacked", t.d.MessageID)
	}
	now := time.Now()
	t.set, t.deadline = now, now.Add(extension)
	s.mu.Unlock()
	s.poke()

	return s.sendWait(ctx, outcome{kind: outcomeExtend, ids: []string{t.d.MessageID}, extension: &extension})
}

// extendLoop extends, in batches, the deadlines of the deliveries that are
// still pending, until the session ends. Each is extended when two thirds
// of its time left have passed, by the group's ack deadline, until it has
// been pending for MaxExtension; deliveries past half of their time go
// along with a batch.
func (s *session) extendLoop() {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		ids, next := s.dueExtensions(time.Now())
		if len(ids) > 0 {
			s.log.Debug("extending ack deadlines", "count", len(ids))
			select {
			case s.out <- outcome{kind: outcomeExtend, ids: ids}:
			case <-s.ctx.Done():
				return
			}
		}
		var due <-chan time.Time
		if !next.IsZero() {
			timer.Reset(time.Until(next))
			due = timer.C
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.wake:
		case <-due:
		}
	}
}

// dueExtensions picks the deliveries to extend at now, counts them as
// extended, and says when the next one falls due (zero: none).
func (s *session) dueExtensions(now time.Time) (ids []string, next time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	limit := s.r.c.cfg.MaxExtension
	var due, early []*tracked
	for t := range s.pending {
		if t.window == 0 || now.Sub(t.arrived) >= limit {
			continue
		}
		span := t.deadline.Sub(t.set)
		switch {
		case !now.Before(t.set.Add(span * 2 / 3)):
			due = append(due, t)
		case !now.Before(t.set.Add(span / 2)):
			early = append(early, t)
		}
	}
	if len(due) > 0 {
		for _, t := range append(due, early...) {
			t.set, t.deadline = now, now.Add(t.window)
			ids = append(ids, t.d.MessageID)
		}
	}
	for t := range s.pending {
		if t.window == 0 || now.Sub(t.arrived) >= limit {
			continue
		}
		at := t.set.Add(t.deadline.Sub(t.set) * 2 / 3)
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return ids, next
}
