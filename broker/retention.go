package broker

import (
	"context"
	"errors"
	"time"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// retentionBatch bounds what one Trim or Prune command deletes, so that
// cleanup is many small Raft entries interleaved with the writes, never one
// long bbolt transaction that stalls them.
const retentionBatch = 1000

// runRetention drops, on the leader, committed messages past the retention
// period or over the size limit of their topic, resolved half messages once
// both the retention period and the dedup window are over, and dedup keys
// past the dedup window. bbolt reuses the pages it frees, so under steady
// load the file stops growing (docs/operations.md, Retention).
func (b *Broker) runRetention(ctx context.Context) {
	t := time.NewTicker(b.cfg.RetentionInterval)
	defer t.Stop()
	for {
		if err := b.retentionRound(ctx); err != nil && ctx.Err() == nil {
			b.log.Warn("retention round failed; retrying at the next", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (b *Broker) retentionRound(ctx context.Context) error {
	var topics []string
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		ts, err := tx.Topics()
		for _, tp := range ts {
			topics = append(topics, tp.Name)
		}
		return err
	})
	if err != nil {
		return err
	}
	for _, topic := range topics {
		// A topic an operator deleted meanwhile has nothing left to trim.
		if err := b.trimTopic(ctx, topic); err != nil && !errors.Is(err, halfstore.ErrNotFound) {
			return err
		}
	}
	now := b.clock.Now()
	resolvedBefore := now.Add(-max(b.cfg.Retention, b.cfg.DedupWindow)).UnixNano()
	dedupBefore := now.Add(-b.cfg.DedupWindow).UnixNano()
	for ctx.Err() == nil {
		due := false
		if err := b.node.Store().View(func(tx *halfstore.Tx) error {
			due = tx.PruneDue(resolvedBefore, dedupBefore)
			return nil
		}); err != nil || !due {
			return err
		}
		r, err := b.node.Prune(ctx, now, &raftpb.Prune{
			ResolvedBefore: resolvedBefore, DedupBefore: dedupBefore, Limit: retentionBatch,
		})
		if err != nil {
			return err
		}
		n := r.HalfMessages + r.DedupKeys
		if n == 0 {
			return nil
		}
		b.metrics.pruned.Add(float64(n))
	}
	return ctx.Err()
}

// trimTopic drops a topic's expired messages, a bounded batch at a time.
func (b *Broker) trimTopic(ctx context.Context, topic string) error {
	for ctx.Err() == nil {
		now := b.clock.Now()
		var through uint64
		err := b.node.Store().View(func(tx *halfstore.Tx) error {
			var err error
			through, err = tx.TrimPoint(topic, now.Add(-b.cfg.Retention).UnixNano(), b.cfg.RetentionBytes, retentionBatch)
			return err
		})
		if err != nil || through == 0 {
			return err
		}
		r, err := b.node.Trim(ctx, now, &raftpb.Trim{Topic: topic, Through: through, Limit: retentionBatch})
		if err != nil {
			return err
		}
		if r.Messages == 0 {
			return nil
		}
		b.metrics.trimmed.WithLabelValues(topic).Add(float64(r.Messages))
		b.log.Info("retention dropped messages", "topic", topic, "count", r.Messages, "through_seq", through)
	}
	return ctx.Err()
}
