// Package outbox is the local message table (transactional outbox): a
// service writes the message into an outbox table in the same database
// transaction as its business change, so the message exists exactly when
// the change committed, and a Relay sends the table's rows to the broker in
// the background, retrying with backoff for as long as the broker is away.
//
// A row goes PENDING → SENDING → SENT, or back to PENDING with a later
// next_retry_at after a failed send, or to FAILED after MaxAttempts failed
// sends (with last_error, for an operator or the reconciliation job). Every
// change of status is a conditional update on the status it expects, so two
// relays never both send a row, and a relay that died in SENDING hands its
// rows back after SendingTimeout. The row's msg_id is the broker's dedup
// key: a row sent again after a crash between the broker's answer and the
// SENT update is stored once, under its first message ID.
//
// The package uses only database/sql; the caller opens the database with
// its driver and names its Dialect.
package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	txmq "github.com/txmq/txmq/client/go"
)

// The row statuses.
const (
	StatusPending = "PENDING"
	StatusSending = "SENDING"
	StatusSent    = "SENT"
	StatusFailed  = "FAILED"
)

const defaultTable = "txmq_outbox"

var (
	// ErrDuplicate: Write found a row with the message's ID already.
	ErrDuplicate = errors.New("outbox: duplicate message ID")
	// ErrInvalid: a message or configuration the package cannot use.
	ErrInvalid = errors.New("outbox: invalid")
)

// Table names an outbox table in a database of a dialect.
type Table struct {
	Dialect txmq.Dialect
	// Name defaults to txmq_outbox.
	Name string
}

func (t Table) name() string {
	if t.Name == "" {
		return defaultTable
	}
	return t.Name
}

func (t Table) check() error {
	if err := t.Dialect.Check(); err != nil {
		return fmt.Errorf("%w: table %s: %w", ErrInvalid, t.name(), err)
	}
	return nil
}

// Message is a message to send through the outbox.
type Message struct {
	// ID is the message's unique ID in the outbox (msg_id), and its key at
	// the broker: the dedup key of Producer.Send and the Key consumers see.
	// Derive it from the business event, e.g. "order-42:paid", so that the
	// same event always gets the same ID. Required, at most 255 bytes.
	ID    string
	Topic string
	// OrderingKey, when set, orders the message among those of its topic
	// with the same key (see txmq.Message).
	OrderingKey string
	Properties  map[string]string
	Body        []byte
}

// DDL is the table's CREATE statements for its dialect. Times are Unix
// milliseconds (BIGINT), which every database and driver compares alike.
func (t Table) DDL() []string {
	n := t.name()
	id, body := "BIGINT AUTO_INCREMENT PRIMARY KEY", "LONGBLOB"
	switch t.Dialect {
	case txmq.Postgres:
		id, body = "BIGSERIAL PRIMARY KEY", "BYTEA"
	case txmq.SQLite:
		id, body = "INTEGER PRIMARY KEY AUTOINCREMENT", "BLOB"
	}
	cols := `CREATE TABLE IF NOT EXISTS ` + n + ` (
	id                ` + id + `,
	msg_id            VARCHAR(255) NOT NULL UNIQUE,
	topic             VARCHAR(127) NOT NULL,
	ordering_key      VARCHAR(255) NOT NULL,
	properties        TEXT         NOT NULL,
	body              ` + body + ` NOT NULL,
	status            VARCHAR(16)  NOT NULL,
	retry_count       INT          NOT NULL,
	next_retry_at     BIGINT       NOT NULL,
	last_error        TEXT,
	claimed_by        VARCHAR(64),
	claimed_at        BIGINT,
	broker_message_id VARCHAR(64),
	created_at        BIGINT       NOT NULL,
	updated_at        BIGINT       NOT NULL`
	if t.Dialect == txmq.MySQL {
		// MySQL has no CREATE INDEX IF NOT EXISTS.
		return []string{cols + `,
	INDEX ` + n + `_due (status, next_retry_at)
)`}
	}
	return []string{cols + `
)`, `CREATE INDEX IF NOT EXISTS ` + n + `_due ON ` + n + ` (status, next_retry_at)`}
}

// CreateTable creates the table and its index if they do not exist.
func (t Table) CreateTable(ctx context.Context, db txmq.Execer) error {
	if err := t.check(); err != nil {
		return err
	}
	for _, s := range t.DDL() {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("outbox: create %s: %w", t.name(), err)
		}
	}
	return nil
}

// Write inserts m into the outbox as PENDING, due now, through tx: the
// caller's database transaction, the one that makes the business change.
// Nothing is sent before that transaction commits, and nothing at all if it
// rolls back. A message whose ID is in the table already is not written
// again, and Write returns an error matching ErrDuplicate, which leaves tx
// usable.
func (t Table) Write(ctx context.Context, tx txmq.Execer, m Message) error {
	if err := t.check(); err != nil {
		return err
	}
	switch {
	case m.ID == "" || len(m.ID) > 255:
		return fmt.Errorf("%w: message ID %q is empty or over 255 bytes", ErrInvalid, m.ID)
	case m.Topic == "":
		return fmt.Errorf("%w: message %s has no topic", ErrInvalid, m.ID)
	case len(m.Body) == 0:
		return fmt.Errorf("%w: message %s has an empty body", ErrInvalid, m.ID)
	}
	props := ""
	if len(m.Properties) > 0 {
		b, err := json.Marshal(m.Properties)
		if err != nil {
			return fmt.Errorf("%w: message %s: properties: %w", ErrInvalid, m.ID, err)
		}
		props = string(b)
	}
	now := time.Now().UnixMilli()
	q := t.Dialect.InsertIgnore(t.name(),
		"msg_id, topic, ordering_key, properties, body, status, retry_count, next_retry_at, created_at, updated_at", 10)
	res, err := tx.ExecContext(ctx, q, m.ID, m.Topic, m.OrderingKey, props, m.Body, StatusPending, 0, now, now, now)
	if err != nil {
		return fmt.Errorf("outbox: write %s: %w", m.ID, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("outbox: write %s: %w", m.ID, err)
	}
	if n == 0 {
		return fmt.Errorf("%w: %s is in %s already", ErrDuplicate, m.ID, t.name())
	}
	return nil
}

// Row is a row of the outbox, as Rows reads it.
type Row struct {
	ID              int64
	MsgID           string
	Topic           string
	Status          string
	RetryCount      int
	NextRetryAt     time.Time
	LastError       string
	BrokerMessageID string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// Rows reads the rows in a status ("" for all), oldest first, at most
// limit of them: what an operator looks at, e.g. the FAILED ones.
func (t Table) Rows(ctx context.Context, db txmq.Querier, status string, limit int) ([]Row, error) {
	if err := t.check(); err != nil {
		return nil, err
	}
	q := `SELECT id, msg_id, topic, status, retry_count, next_retry_at, COALESCE(last_error, ''),
		COALESCE(broker_message_id, ''), created_at, updated_at FROM ` + t.name() + ` WHERE status = ? OR ? = '' ORDER BY id LIMIT ?`
	rows, err := db.QueryContext(ctx, t.Dialect.Rebind(q), status, status, limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: read %s: %w", t.name(), err)
	}
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var next, created, updated int64
		if err := rows.Scan(&r.ID, &r.MsgID, &r.Topic, &r.Status, &r.RetryCount, &next, &r.LastError,
			&r.BrokerMessageID, &created, &updated); err != nil {
			return nil, fmt.Errorf("outbox: read %s: %w", t.name(), err)
		}
		r.NextRetryAt, r.CreatedAt, r.UpdatedAt = time.UnixMilli(next), time.UnixMilli(created), time.UnixMilli(updated)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("outbox: read %s: %w", t.name(), err)
	}
	return out, nil
}
