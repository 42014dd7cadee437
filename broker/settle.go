package broker

import (
	"context"
	"slices"
	"time"

	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// failure is a delivery that ended without an ack, waiting to be recorded.
type failure struct {
	e *entry
	// now: redeliver at once (the subscriber went away); else delay, or the
	// backoff schedule when !explicit.
	now      bool
	explicit bool
	delay    time.Duration
	err      string
	// dead: to the dead-letter queue now, whatever attempts are left (the
	// consumer terminated the delivery).
	dead bool
}

// ack replicates the acks of a subscriber and returns the message IDs that
// are now durably acked. IDs the group does not wait for (already acked,
// unknown, or with an ack or failure being replicated) are left out. An ack
// of a message that is not in flight (it came late, after its deadline) is
// taken: the consumer did the work.
func (d *dispatcher) ack(ctx context.Context, ids []string) ([]string, error) {
	d.mu.Lock()
	var (
		acking []*entry
		acked  []string
		cmd    = &raftpb.Ack{Topic: d.key.topic, Group: d.key.group}
	)
	for _, id := range ids {
		e := d.q.get(id)
		if e == nil || !d.q.beginAck(e) {
			continue
		}
		acking = append(acking, e)
		acked = append(acked, id)
		if e.key.redriven {
			cmd.Redriven = append(cmd.Redriven, e.key.seq)
		} else {
			cmd.Sequences = append(cmd.Sequences, e.key.seq)
		}
	}
	d.mu.Unlock()
	if len(acking) == 0 {
		return nil, nil
	}
	err := d.proposeAck(ctx, cmd)
	now := d.b.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	for _, e := range acking {
		if err != nil {
			d.q.ackFailed(e, now)
			continue
		}
		if !d.q.ackDone(e, now) {
			continue
		}
		d.log.Info("acked", d.msgAttrs(e, "attempt", e.attempts)...)
		if !e.key.redriven {
			d.b.metrics.commitToAck.WithLabelValues(d.key.topic, d.key.group).Observe(sinceCommit(e.msg, now))
			if !e.firstDelivery.IsZero() {
				d.b.metrics.firstToAck.WithLabelValues(d.key.topic, d.key.group).Observe(max(now.Sub(e.firstDelivery), 0).Seconds())
			}
		}
	}
	if err != nil {
		return nil, err
	}
	d.b.metrics.acked.WithLabelValues(d.key.topic, d.key.group).Add(float64(len(acking)))
	return acked, nil
}

func (d *dispatcher) proposeAck(ctx context.Context, cmd *raftpb.Ack) error {
	_, err := d.b.node.Ack(raftlog.MayWait(ctx), d.b.clock.Now(), cmd)
	return err
}

// nack fails deliveries at the consumer's request; terminate sends them to
// the dead-letter queue at once.
func (d *dispatcher) nack(ids []string, delay *time.Duration, reason string, terminate bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case reason != "":
	case terminate:
		reason = "terminated by the consumer"
	default:
		reason = "nacked by the consumer"
	}
	for _, id := range ids {
		e := d.q.get(id)
		if e == nil || !d.q.beginFail(e) {
			continue
		}
		f := failure{e: e, err: reason, dead: terminate}
		if delay != nil {
			f.explicit, f.delay = true, *delay
		}
		d.fail(f)
	}
	d.poke()
}

// extend pushes the deadlines of deliveries in flight.
func (d *dispatcher) extend(ids []string, by *time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ext := d.pol.ackDeadline
	if by != nil {
		ext = *by
	}
	deadline := d.b.clock.Now().Add(ext)
	for _, id := range ids {
		if e := d.q.get(id); e != nil {
			d.q.extend(e, deadline)
		}
	}
}

// fail queues a failure the queue has begun (the entry is failing) for
// recording through Raft, before the message is redelivered or
// dead-lettered.
func (d *dispatcher) fail(f failure) {
	d.log.Info("delivery failed", d.msgAttrs(f.e, "attempt", f.e.attempts, "reason", f.err)...)
	d.failed = append(d.failed, f)
}

// record replicates a batch of failures in the background; when it is
// applied, each message is scheduled again or leaves for the DLQ.
func (d *dispatcher) record(now time.Time) {
	batch := d.failed[:min(len(d.failed), recordBatch)]
	d.failed = slices.Clone(d.failed[len(batch):])
	cmd := &raftpb.RecordFailures{Topic: d.key.topic, Group: d.key.group}
	retryAt := make([]time.Time, len(batch))
	for i, f := range batch {
		e := f.e
		switch {
		case f.now:
			retryAt[i] = now
		case f.explicit:
			retryAt[i] = now.Add(f.delay)
		default:
			retryAt[i] = now.Add(d.pol.backoffFor(e.attempts))
		}
		cmd.Failures = append(cmd.Failures, &raftpb.Failure{
			Sequence: e.key.seq,
			Redriven: e.key.redriven,
			Attempts: e.attempts,
			RetryAt:  retryAt[i].UnixNano(),
			Error:    f.err,
			Dead:     f.dead || e.attempts >= d.pol.maxDeliveries,
		})
	}
	d.recording = true
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		err := d.proposeFailures(cmd, now)
		d.recorded(batch, cmd, retryAt, err)
	}()
}

func (d *dispatcher) proposeFailures(cmd *raftpb.RecordFailures, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	_, err := d.b.node.RecordFailures(ctx, now, cmd)
	return err
}

// recorded schedules the messages of a recorded batch again, or moves them
// to the DLQ. A batch that could not be recorded is redelivered anyway.
func (d *dispatcher) recorded(batch []failure, cmd *raftpb.RecordFailures, retryAt []time.Time, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	defer d.poke()
	d.recording = false
	if err != nil && !d.closed {
		d.log.Warn("failed deliveries not recorded; redelivering them anyway", "err", err, "count", len(batch))
	}
	now := d.b.clock.Now()
	for i, f := range batch {
		e := f.e
		if err != nil || !cmd.Failures[i].Dead {
			d.q.retry(e, retryAt[i], f.err, now)
			continue
		}
		if !d.q.deadLettered(e, d.pol.hold, now) {
			continue
		}
		d.b.metrics.deadLettered.WithLabelValues(d.key.topic, d.key.group).Inc()
		d.log.Warn("message moved to the dead-letter queue", d.msgAttrs(e, "attempts", e.attempts,
			"last_error", f.err, "ordering_key", e.msg.OrderingKey)...)
		if k := e.msg.OrderingKey; k != "" && d.pol.hold && d.heldSince != nil {
			d.heldSince[k] = true
		}
	}
}
