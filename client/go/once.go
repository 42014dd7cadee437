package txmq

import (
	"context"
	"database/sql"
	"fmt"
)

// DefaultRecordInsert records a processed delivery in the consumer_record
// table, doing nothing when the row exists. It works on PostgreSQL and
// SQLite; on MySQL and MariaDB pass WithDialect(MySQL), which uses
//
//	INSERT IGNORE INTO consumer_record (consumer_group, message_id) VALUES (?, ?)
//
// Its arguments are the consumer group and the message ID, in that order.
const DefaultRecordInsert = `INSERT INTO consumer_record (consumer_group, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING`

type onceOptions struct {
	insert string
}

// OnceOption adjusts ProcessOnce.
type OnceOption func(*onceOptions)

// WithRecordInsert replaces DefaultRecordInsert: a statement that takes the
// consumer group and the message ID, inserts a row for them into a table
// with a unique key on the pair, and affects no row when one is there
// already (MySQL: INSERT IGNORE; PostgreSQL and SQLite: ON CONFLICT DO
// NOTHING). Use it for another table name, or more columns with database
// defaults.
func WithRecordInsert(query string) OnceOption {
	return func(o *onceOptions) { o.insert = query }
}

// WithDialect writes the record into consumer_record with the
// insert-or-ignore statement of d: what MySQL and MariaDB need, as they
// have no ON CONFLICT.
func WithDialect(d Dialect) OnceOption {
	return func(o *onceOptions) {
		o.insert = d.InsertIgnore("consumer_record", "consumer_group, message_id", 2)
	}
}

// ProcessOnce applies a delivery to a database at most once per consumer
// group, however often it is delivered: the consumer_record pattern. db is
// a *sql.DB or a *sql.Conn (a connection the caller holds). In one database
// transaction it inserts (d.Group, d.MessageID) into the consumer_record
// table, whose primary key is that pair, with an insert that does nothing
// on conflict. If the row was there already, the delivery was applied
// before: ProcessOnce rolls back and returns applied false and a nil error,
// so the handler returns nil and the delivery is acked. Otherwise it runs
// apply in the same transaction and commits, and returns applied true. If
// apply or the commit fails, nothing is kept (not even the record) and the
// error is returned, so the handler returns it and the message comes again.
// (A commit that failed on the way back may have committed: the next
// delivery then finds the record.)
//
// The record and the business change must commit together, in the same
// local transaction: recorded first and committed alone, a crash before the
// change would skip the message for ever; changed first, a crash before the
// record would apply it twice. apply must therefore do all its writes
// through tx. The table:
//
//	CREATE TABLE consumer_record (
//		consumer_group VARCHAR(127) NOT NULL,
//		message_id     VARCHAR(64)  NOT NULL,
//		processed_at   TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
//		PRIMARY KEY (consumer_group, message_id)
//	);
//
// The duplicate is found by the key, inside the transaction, never by a
// read before the write: two members of a group handed the same message at
// once (a redelivery after a missed deadline) are kept apart because the
// second insert waits for the first transaction and then affects no row
// (or fails on a lock conflict, and the delivery is tried again).
func ProcessOnce(ctx context.Context, db TxBeginner, d *Delivery, apply func(ctx context.Context, tx *sql.Tx) error, opts ...OnceOption) (applied bool, err error) {
	if db == nil {
		return false, invalidf("ProcessOnce: db is nil")
	}
	if apply == nil {
		return false, invalidf("ProcessOnce: apply is nil")
	}
	if err := checkDelivery(d); err != nil {
		return false, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("txmq: process %s once: begin: %w", d.MessageID, err)
	}
	// After a commit this does nothing.
	defer func() { _ = tx.Rollback() }()
	first, err := record(ctx, tx, d, opts)
	if err != nil || !first {
		return false, err
	}
	if err := apply(ctx, tx); err != nil {
		return false, err
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("txmq: process %s once: commit: %w", d.MessageID, err)
	}
	return true, nil
}

// ProcessOnceInTx is ProcessOnce inside a transaction the caller already
// has, and commits itself: tx is a *sql.Tx (or a wrapper of one). It
// records the delivery through tx; when the record was there already it
// returns applied false and does not call apply; otherwise it calls apply,
// which writes through the same tx, and returns applied true. On any error
// the caller must roll tx back: committed, it would keep the record without
// the change.
func ProcessOnceInTx(ctx context.Context, tx Execer, d *Delivery, apply func(ctx context.Context) error, opts ...OnceOption) (applied bool, err error) {
	if tx == nil {
		return false, invalidf("ProcessOnceInTx: tx is nil")
	}
	if apply == nil {
		return false, invalidf("ProcessOnceInTx: apply is nil")
	}
	if err := checkDelivery(d); err != nil {
		return false, err
	}
	first, err := record(ctx, tx, d, opts)
	if err != nil || !first {
		return false, err
	}
	if err := apply(ctx); err != nil {
		return false, err
	}
	return true, nil
}

func checkDelivery(d *Delivery) error {
	if d == nil || d.MessageID == "" || d.Group == "" {
		return invalidf("ProcessOnce: the delivery has no message ID or consumer group")
	}
	return nil
}

// record inserts the delivery's consumer_record row and reports whether it
// is new.
func record(ctx context.Context, tx Execer, d *Delivery, opts []OnceOption) (bool, error) {
	o := onceOptions{insert: DefaultRecordInsert}
	for _, opt := range opts {
		opt(&o)
	}
	res, err := tx.ExecContext(ctx, o.insert, d.Group, d.MessageID)
	if err != nil {
		return false, fmt.Errorf("txmq: process %s once: record: %w", d.MessageID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("txmq: process %s once: record: %w", d.MessageID, err)
	}
	switch n {
	case 0:
		return false, nil
	case 1:
		return true, nil
	}
	return false, fmt.Errorf("txmq: process %s once: the record insert affected %d rows, not 0 or 1", d.MessageID, n)
}
