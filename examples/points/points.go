package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	txmq "github.com/txmq/txmq/client/go"
)

// topic carries the order service's events to the points service.
const topic = "order-paid"

// The kinds of event on the topic.
const (
	// kindCredit is the order service's own "order paid" event.
	kindCredit = "credit"
	// kindCompensate is reconciliation's: an order paid but without its
	// points. It credits like kindCredit, under an ID of its own.
	kindCompensate = "compensate"
	// kindReverse is reconciliation's: points credited for an order that
	// does not exist. It takes them back.
	kindReverse = "reverse"
)

// OrderPaid is the body of a message on the topic.
type OrderPaid struct {
	OrderID string `json:"order_id"`
	UserID  string `json:"user_id"`
	Points  int64  `json:"points"`
	// PaidAt is when the order service committed the order, in Unix
	// milliseconds: reconciliation's window, and the latency's start.
	PaidAt int64  `json:"paid_at_ms"`
	Kind   string `json:"kind,omitempty"`
}

var errBadEvent = errors.New("an order-paid event needs order_id, user_id, positive points and a known kind")

func (ev OrderPaid) check() error {
	if ev.OrderID == "" || ev.UserID == "" || ev.Points <= 0 {
		return errBadEvent
	}
	switch ev.Kind {
	case "", kindCredit, kindCompensate, kindReverse:
		return nil
	}
	return errBadEvent
}

// pointsSchema is the points service's database: the consumer_record table
// that txmq.ProcessOnce writes, the balances, and the ledger that
// reconciliation compares with the orders. The ledger's key on (order_id,
// entry) holds one credit and one reversal per order at most, so that a
// compensation and a late original (different messages, both applied once
// by ProcessOnce) cannot both credit the order.
func pointsSchema(d txmq.Dialect) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS consumer_record (
	consumer_group VARCHAR(127) NOT NULL,
	message_id     VARCHAR(64)  NOT NULL,
	processed_at   TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
	PRIMARY KEY (consumer_group, message_id)
)`,
		`CREATE TABLE IF NOT EXISTS points_balance (
	user_id VARCHAR(64) PRIMARY KEY,
	balance BIGINT      NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS points_ledger (
	id            ` + autoID(d) + `,
	message_id    VARCHAR(64) NOT NULL,
	order_id      VARCHAR(64) NOT NULL,
	user_id       VARCHAR(64) NOT NULL,
	points        BIGINT      NOT NULL,
	entry         VARCHAR(16) NOT NULL,
	order_paid_at BIGINT      NOT NULL,
	applied_at    BIGINT      NOT NULL,
	UNIQUE (order_id, entry)
)`,
	}
}

// Points credits the points of paid orders, each message once.
type Points struct {
	db      *sql.DB
	dialect txmq.Dialect
	log     *slog.Logger
	// onApply, when set, hears of every delivery ProcessOnce applied, and
	// whether it changed the ledger: the drills count duplicates with it.
	onApply func(d *txmq.Delivery, ev OrderPaid, changed bool)
}

// newPoints creates the schema if need be.
func newPoints(ctx context.Context, db *sql.DB, d txmq.Dialect, log *slog.Logger) (*Points, error) {
	if err := execAll(ctx, db, pointsSchema(d)...); err != nil {
		return nil, fmt.Errorf("points schema: %w", err)
	}
	return &Points{db: db, dialect: d, log: log}, nil
}

// Handle is the consumer's handler. It returns nil (ack) once the message
// is applied, now or by an earlier delivery, and an error (nack: the broker
// delivers it again) otherwise.
func (p *Points) Handle(ctx context.Context, d *txmq.Delivery) error {
	var ev OrderPaid
	if err := json.Unmarshal(d.Body, &ev); err != nil {
		return fmt.Errorf("order-paid message %s: %w", d.MessageID, err)
	}
	if err := ev.check(); err != nil {
		return fmt.Errorf("order-paid message %s: %w: %s", d.MessageID, err, d.Body)
	}
	var changed bool
	applied, err := txmq.ProcessOnce(ctx, p.db, d, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		changed, err = p.apply(ctx, tx, d.MessageID, ev)
		return err
	}, txmq.WithDialect(p.dialect))
	if err != nil {
		return err
	}
	if applied && p.onApply != nil {
		p.onApply(d, ev, changed)
	}
	p.log.Debug("order-paid", "msg_id", d.MessageID, "attempt", d.Attempt, "order", ev.OrderID, "kind", ev.Kind,
		"user", ev.UserID, "points", ev.Points, "applied", applied, "changed", changed)
	return nil
}

// apply writes the ledger entry and the balance, unless the order has that
// entry already.
func (p *Points) apply(ctx context.Context, tx *sql.Tx, msgID string, ev OrderPaid) (bool, error) {
	entry, delta := kindCredit, ev.Points
	if ev.Kind == kindReverse {
		entry, delta = kindReverse, -ev.Points
	}
	res, err := tx.ExecContext(ctx, p.dialect.InsertIgnore("points_ledger",
		"message_id, order_id, user_id, points, entry, order_paid_at, applied_at", 7),
		msgID, ev.OrderID, ev.UserID, delta, entry, ev.PaidAt, time.Now().UnixMilli())
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return false, err
	}
	upsert := `INSERT INTO points_balance (user_id, balance) VALUES (?, ?)
		ON CONFLICT (user_id) DO UPDATE SET balance = points_balance.balance + excluded.balance`
	if p.dialect == txmq.MySQL {
		upsert = `INSERT INTO points_balance (user_id, balance) VALUES (?, ?)
		ON DUPLICATE KEY UPDATE balance = balance + VALUES(balance)`
	}
	_, err = tx.ExecContext(ctx, p.dialect.Rebind(upsert), ev.UserID, delta)
	return err == nil, err
}

// Balance is the user's points balance, 0 for a user without one.
func Balance(ctx context.Context, db *sql.DB, d txmq.Dialect, userID string) (int64, error) {
	var b int64
	err := db.QueryRowContext(ctx, d.Rebind(`SELECT balance FROM points_balance WHERE user_id = ?`), userID).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return b, err
}
