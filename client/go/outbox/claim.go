package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	txmq "github.com/txmq/txmq/client/go"
)

const rowColumns = `id, msg_id, topic, ordering_key, properties, body, retry_count`

// claim takes up to BatchSize due PENDING rows for this scan, marking them
// SENDING with token, and returns them. No two claims get the same row:
// PostgreSQL and MySQL lock the rows they select and skip those another
// claim holds (FOR UPDATE SKIP LOCKED); SQLite, which has one writer at a
// time, selects and updates in one statement.
func (r *Relay) claim(ctx context.Context, token string) ([]claimedRow, error) {
	t := r.cfg.Table
	now := time.Now().UnixMilli()
	if t.Dialect == txmq.SQLite {
		q := `UPDATE ` + t.name() + ` SET status = ?, claimed_by = ?, claimed_at = ?, updated_at = ?
			WHERE id IN (SELECT id FROM ` + t.name() + ` WHERE status = ? AND next_retry_at <= ? ORDER BY next_retry_at, id LIMIT ?)`
		if _, err := r.cfg.DB.ExecContext(ctx, q, StatusSending, token, now, now, StatusPending, now, r.cfg.BatchSize); err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		rows, err := r.cfg.DB.QueryContext(ctx, `SELECT `+rowColumns+` FROM `+t.name()+` WHERE claimed_by = ? ORDER BY id`, token)
		if err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		return scanClaimed(rows)
	}
	tx, err := r.cfg.DB.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, t.Dialect.Rebind(`SELECT `+rowColumns+` FROM `+t.name()+`
		WHERE status = ? AND next_retry_at <= ? ORDER BY next_retry_at, id LIMIT ? FOR UPDATE SKIP LOCKED`),
		StatusPending, now, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	claimed, err := scanClaimed(rows)
	if err != nil || len(claimed) == 0 {
		return nil, err
	}
	ids := make([]any, 0, len(claimed)+4)
	ids = append(ids, StatusSending, token, now, now)
	for _, c := range claimed {
		ids = append(ids, c.id)
	}
	marks := strings.TrimSuffix(strings.Repeat("?, ", len(claimed)), ", ")
	if _, err := tx.ExecContext(ctx, t.Dialect.Rebind(`UPDATE `+t.name()+` SET status = ?, claimed_by = ?, claimed_at = ?, updated_at = ?
		WHERE id IN (`+marks+`)`), ids...); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	if err := tx.Commit(); err != nil {
		// Unknown outcome: rows claimed by a commit that did happen are
		// reset after SendingTimeout.
		return nil, fmt.Errorf("outbox: claim: commit: %w", err)
	}
	return claimed, nil
}

func scanClaimed(rows *sql.Rows) ([]claimedRow, error) {
	defer rows.Close()
	var out []claimedRow
	for rows.Next() {
		var c claimedRow
		if err := rows.Scan(&c.id, &c.msgID, &c.topic, &c.orderingKey, &c.properties, &c.body, &c.retries); err != nil {
			return nil, fmt.Errorf("outbox: claim: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: claim: %w", err)
	}
	return out, nil
}

// resetStuck makes rows that stayed SENDING past SendingTimeout PENDING and
// due again: their relay died, or lost its database, between claim and
// outcome. Their retry count is kept.
func (r *Relay) resetStuck(ctx context.Context) (int, error) {
	t := r.cfg.Table
	now := time.Now()
	res, err := r.cfg.DB.ExecContext(ctx, t.Dialect.Rebind(`UPDATE `+t.name()+` SET status = ?, claimed_by = NULL,
		next_retry_at = ?, updated_at = ? WHERE status = ? AND claimed_at < ?`),
		StatusPending, now.UnixMilli(), now.UnixMilli(), StatusSending, now.Add(-r.cfg.SendingTimeout).UnixMilli())
	if err != nil {
		return 0, fmt.Errorf("outbox: reset stuck rows: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: reset stuck rows: %w", err)
	}
	if n > 0 {
		r.log.Warn("outbox rows stuck in SENDING made pending again", "rows", n, "sending_timeout", r.cfg.SendingTimeout)
	}
	return int(n), nil
}

// pruneIfDue deletes, once a minute, up to a batch of SENT rows older than
// Retention per round.
func (r *Relay) pruneIfDue(ctx context.Context) (int, error) {
	if r.cfg.Retention < 0 || !r.due(&r.lastPrune, pruneEvery) {
		return 0, nil
	}
	t := r.cfg.Table
	before := time.Now().Add(-r.cfg.Retention).UnixMilli()
	q := `DELETE FROM ` + t.name() + ` WHERE id IN (SELECT id FROM ` + t.name() + ` WHERE status = ? AND updated_at < ? LIMIT ?)`
	if t.Dialect == txmq.MySQL {
		// MySQL allows no LIMIT in an IN subquery, but one on DELETE.
		q = `DELETE FROM ` + t.name() + ` WHERE status = ? AND updated_at < ? LIMIT ?`
	}
	res, err := r.cfg.DB.ExecContext(ctx, t.Dialect.Rebind(q), StatusSent, before, 10*r.cfg.BatchSize)
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	return int(n), nil
}

// due reports whether every has passed since *last, and if so sets it.
func (r *Relay) due(last *time.Time, every time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(*last) >= every {
		*last = now
		return true
	}
	return false
}

// Stats is the outbox now: what the gauges show.
type Stats struct {
	// Backlog is the rows PENDING or SENDING.
	Backlog int64
	// OldestPending is the age of the oldest of them, 0 without any.
	OldestPending time.Duration
	// Failed is the rows parked as FAILED.
	Failed int64
}

// Stats reads the backlog, the oldest pending row and the parked rows, and
// sets the gauges.
func (r *Relay) Stats(ctx context.Context) (Stats, error) {
	t := r.cfg.Table
	rows, err := r.cfg.DB.QueryContext(ctx, t.Dialect.Rebind(`SELECT status, COUNT(*), MIN(created_at) FROM `+t.name()+`
		WHERE status IN (?, ?, ?) GROUP BY status`), StatusPending, StatusSending, StatusFailed)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	defer rows.Close()
	var s Stats
	oldest := int64(0)
	for rows.Next() {
		var status string
		var n, first int64
		if err := rows.Scan(&status, &n, &first); err != nil {
			return Stats{}, fmt.Errorf("outbox: stats: %w", err)
		}
		if status == StatusFailed {
			s.Failed = n
			continue
		}
		s.Backlog += n
		if oldest == 0 || first < oldest {
			oldest = first
		}
	}
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("outbox: stats: %w", err)
	}
	if oldest != 0 {
		s.OldestPending = max(time.Since(time.UnixMilli(oldest)), 0)
	}
	r.m.Backlog.Set(float64(s.Backlog))
	r.m.OldestPending.Set(s.OldestPending.Seconds())
	r.m.Failed.Set(float64(s.Failed))
	return s, nil
}

// statsLoop refreshes the gauges every statsEvery until ctx ends.
func (r *Relay) statsLoop(ctx context.Context) {
	t := time.NewTicker(statsEvery)
	defer t.Stop()
	for {
		if _, err := r.Stats(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("outbox stats failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
