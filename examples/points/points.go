package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	txmq "github.com/txmq/txmq/client/go"

	// The pure-Go SQLite driver, registered as "sqlite": no cgo, so the
	// example builds without a C compiler.
	_ "modernc.org/sqlite"
)

// schema is the points service's database: the consumer_record table that
// txmq.ProcessOnce writes, the balances, and a ledger that reconciliation
// compares with the orders.
const schema = `
CREATE TABLE IF NOT EXISTS consumer_record (
	consumer_group VARCHAR(127) NOT NULL,
	message_id     VARCHAR(64)  NOT NULL,
	processed_at   TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
	PRIMARY KEY (consumer_group, message_id)
);
CREATE TABLE IF NOT EXISTS points_balance (
	user_id TEXT    PRIMARY KEY,
	balance INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS points_ledger (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	message_id TEXT    NOT NULL,
	order_id   TEXT    NOT NULL,
	user_id    TEXT    NOT NULL,
	points     INTEGER NOT NULL,
	created_at TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP
);
`

// OrderPaid is the body of an "order-paid" message.
type OrderPaid struct {
	OrderID string `json:"order_id"`
	UserID  string `json:"user_id"`
	Points  int64  `json:"points"`
}

// Points credits the points of paid orders, each message once.
type Points struct {
	db  *sql.DB
	log *slog.Logger
}

// OpenDB opens (creating if need be) the SQLite database at path.
func OpenDB(ctx context.Context, path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
	if err != nil {
		return nil, err
	}
	// SQLite has one writer at a time; one connection makes handlers take
	// turns instead of failing with SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(ctx, schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("create schema in %s: %w", path, err)
	}
	return db, nil
}

// Handle is the consumer's handler. It returns nil (ack) once the message's
// points are credited, now or by an earlier delivery, and an error (nack:
// the broker delivers it again) otherwise.
func (p *Points) Handle(ctx context.Context, d *txmq.Delivery) error {
	var ev OrderPaid
	if err := json.Unmarshal(d.Body, &ev); err != nil {
		return fmt.Errorf("order-paid message %s: %w", d.MessageID, err)
	}
	if ev.OrderID == "" || ev.UserID == "" || ev.Points <= 0 {
		return fmt.Errorf("order-paid message %s: %w: %s", d.MessageID, errBadEvent, d.Body)
	}
	applied, err := txmq.ProcessOnce(ctx, p.db, d, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO points_balance (user_id, balance) VALUES ($1, $2)
			 ON CONFLICT (user_id) DO UPDATE SET balance = balance + excluded.balance`,
			ev.UserID, ev.Points); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO points_ledger (message_id, order_id, user_id, points) VALUES ($1, $2, $3, $4)`,
			d.MessageID, ev.OrderID, ev.UserID, ev.Points)
		return err
	})
	if err != nil {
		return err
	}
	p.log.Info("order-paid", "msg_id", d.MessageID, "attempt", d.Attempt, "order", ev.OrderID,
		"user", ev.UserID, "points", ev.Points, "applied", applied)
	return nil
}

var errBadEvent = errors.New("an order-paid event needs order_id, user_id and positive points")

// Balance is the user's points balance, 0 for a user without one.
func Balance(ctx context.Context, db *sql.DB, userID string) (int64, error) {
	var b int64
	err := db.QueryRowContext(ctx, `SELECT balance FROM points_balance WHERE user_id = $1`, userID).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return b, err
}
