package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/client/go/reconcile"
)

// reconcilerConfig wires the reconciliation job: paid orders against the
// points ledger, compensations and reversals sent on the topic.
type reconcilerConfig struct {
	Orders        *Orders
	PointsDB      *sql.DB
	PointsDialect txmq.Dialect
	Interval      time.Duration
	Grace         time.Duration
	Registerer    prometheus.Registerer
	Log           *slog.Logger
}

func newReconciler(cfg reconcilerConfig) (*reconcile.Job, error) {
	o := cfg.Orders
	return reconcile.New(reconcile.Config{
		Type: "order_paid",
		// Every paid order of the window...
		Expected: func(ctx context.Context, w reconcile.Window) ([]reconcile.Item, error) {
			return items(ctx, o.db, o.dialect.Rebind(`SELECT order_id, points FROM orders WHERE paid_at >= ? AND paid_at < ?`), w)
		},
		// ...has its points, net of reversals; and nothing else has any.
		Actual: func(ctx context.Context, w reconcile.Window) ([]reconcile.Item, error) {
			return items(ctx, cfg.PointsDB, cfg.PointsDialect.Rebind(`SELECT order_id, SUM(points) FROM points_ledger
				WHERE order_paid_at >= ? AND order_paid_at < ? GROUP BY order_id HAVING SUM(points) <> 0`), w)
		},
		Compensate: func(ctx context.Context, a reconcile.Action) error {
			ev := OrderPaid{OrderID: a.BizID, Kind: kindCompensate}
			err := o.db.QueryRowContext(ctx, o.dialect.Rebind(`SELECT user_id, points, paid_at FROM orders WHERE order_id = ?`), a.BizID).
				Scan(&ev.UserID, &ev.Points, &ev.PaidAt)
			if err != nil {
				return fmt.Errorf("read order %s: %w", a.BizID, err)
			}
			return send(ctx, o.producer, a.ID, ev)
		},
		Reverse: func(ctx context.Context, a reconcile.Action) error {
			ev := OrderPaid{OrderID: a.BizID, Kind: kindReverse}
			err := cfg.PointsDB.QueryRowContext(ctx, cfg.PointsDialect.Rebind(`SELECT MIN(user_id), SUM(points), MIN(order_paid_at)
				FROM points_ledger WHERE order_id = ?`), a.BizID).Scan(&ev.UserID, &ev.Points, &ev.PaidAt)
			if err != nil {
				return fmt.Errorf("read the ledger of %s: %w", a.BizID, err)
			}
			return send(ctx, o.producer, a.ID, ev)
		},
		Interval:   cfg.Interval,
		Grace:      cfg.Grace,
		Settle:     max(2*cfg.Interval, cfg.Grace),
		Registerer: cfg.Registerer,
		Logger:     cfg.Log,
	})
}

// send sends an action, keyed by its ID: the broker deduplicates a retry,
// and the consumer sees a message ID of its own.
func send(ctx context.Context, p *txmq.Producer, key string, ev OrderPaid) error {
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	_, err = p.Send(ctx, txmq.Message{Topic: topic, Key: key, Body: body})
	return err
}

func items(ctx context.Context, db *sql.DB, q string, w reconcile.Window) ([]reconcile.Item, error) {
	rows, err := db.QueryContext(ctx, q, w.From.UnixMilli(), w.To.UnixMilli())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []reconcile.Item
	for rows.Next() {
		var id string
		var points int64
		if err := rows.Scan(&id, &points); err != nil {
			return nil, err
		}
		out = append(out, reconcile.Item{ID: id, Value: strconv.FormatInt(points, 10)})
	}
	return out, rows.Err()
}
