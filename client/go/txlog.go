package txmq

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// The values of the status column of the transaction-log table.
const (
	// TxCommitted is written by the local transaction, in the same
	// database transaction as the business change.
	TxCommitted = "committed"
	// TxRolledBack is written by the Checker when it gives up waiting for a
	// local transaction, so that one that comes later cannot commit.
	TxRolledBack = "rolled_back"
)

const (
	defaultTxLogTable = "txmq_tx_log"
	defaultMaxLocalTx = time.Minute
)

// TxLogConfig configures a TxLog.
type TxLogConfig struct {
	// DB is the business database: the table lives beside the business
	// tables, and the local transaction writes both. Required.
	DB *sql.DB
	// Dialect is the database's SQL dialect. Required.
	Dialect Dialect
	// Table is the transaction-log table's name. Default txmq_tx_log.
	Table string
	// MaxLocalTx is the longest a local transaction may take, counted from
	// before SendHalf to its COMMIT, plus a margin for the skew between
	// this host's clock and the broker leader's. Execute cancels a local
	// transaction that runs longer; the Checker answers Rollback for a
	// half message older than this with no row. Default 1 min.
	MaxLocalTx time.Duration
}

// TxLog is the producer side of the transaction-log table (the msg_record
// pattern): Execute runs a local transaction that writes a row for its
// transaction ID together with the business change, and Check answers
// check-backs from that row only, never from a cache.
//
//	log, err := txmq.NewTxLog(txmq.TxLogConfig{DB: db, Dialect: txmq.Postgres})
//	p, err := txmq.NewProducer(txmq.ProducerConfig{ProducerGroup: "orders", Checker: log.Check})
//	id, err := log.Execute(ctx, p, "order-42:paid", msg, func(ctx context.Context, tx *sql.Tx) error {
//		_, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, 42)
//		return err
//	})
type TxLog struct {
	db         *sql.DB
	dialect    Dialect
	table      string
	maxLocalTx time.Duration
}

// NewTxLog checks cfg and fills in its defaults.
func NewTxLog(cfg TxLogConfig) (*TxLog, error) {
	if cfg.DB == nil {
		return nil, invalidf("TxLogConfig.DB is nil")
	}
	if err := cfg.Dialect.Check(); err != nil {
		return nil, err
	}
	if cfg.Table == "" {
		cfg.Table = defaultTxLogTable
	}
	if cfg.MaxLocalTx < 0 {
		return nil, invalidf("TxLogConfig.MaxLocalTx %v is negative", cfg.MaxLocalTx)
	}
	if cfg.MaxLocalTx == 0 {
		cfg.MaxLocalTx = defaultMaxLocalTx
	}
	return &TxLog{db: cfg.DB, dialect: cfg.Dialect, table: cfg.Table, maxLocalTx: cfg.MaxLocalTx}, nil
}

// DDL is the CREATE TABLE statement of the transaction-log table, the same
// on the three dialects. created_at is in Unix milliseconds, which every
// database and driver compares alike. Rows may be deleted once they are
// older than the producer group's max_half_age (24 h by default).
func (l *TxLog) DDL() string {
	return `CREATE TABLE IF NOT EXISTS ` + l.table + ` (
	producer_group VARCHAR(127) NOT NULL,
	tx_id          VARCHAR(255) NOT NULL,
	status         VARCHAR(16)  NOT NULL,
	created_at     BIGINT       NOT NULL,
	PRIMARY KEY (producer_group, tx_id)
)`
}

// CreateTable creates the transaction-log table if it does not exist.
func (l *TxLog) CreateTable(ctx context.Context) error {
	if _, err := l.db.ExecContext(ctx, l.DDL()); err != nil {
		return fmt.Errorf("txmq: create %s: %w", l.table, err)
	}
	return nil
}

// errFenced: the Checker already answered Rollback for this transaction ID.
var errFenced = errors.New("txmq: the check-back rolled this transaction back (it outlived MaxLocalTx)")

// Execute runs the transaction-log pattern end to end with p: SendHalf
// under txID, then one database transaction in which it inserts the row
// (p's group, txID, committed) and runs business with the same *sql.Tx,
// then the database COMMIT, then the broker Commit. It is
// p.SendInTransaction with that local transaction, and returns as it does:
//   - business fails: the database transaction and the half message are
//     rolled back, and the error wraps business's;
//   - the database COMMIT itself fails: its outcome is unknown (the
//     connection may have died after the commit), so the half message is
//     left pending, the error matches ErrOutcomeUnknown, and check-back
//     answers from what the table really holds;
//   - the broker Commit fails after a database commit: the error matches
//     ErrCommitPending, and check-back commits the message.
//
// A retry with the same txID after a crash finds the row and does not run
// business again. The local transaction is cancelled after MaxLocalTx.
// p must have p's group's Checker answering with Check (on this or another
// instance).
func (l *TxLog) Execute(ctx context.Context, p *Producer, txID string, msg Message, business func(ctx context.Context, tx *sql.Tx) error, opts ...HalfOption) (messageID string, err error) {
	if p == nil || business == nil {
		return "", invalidf("TxLog.Execute: producer or business func is nil")
	}
	deadline := time.Now().Add(l.maxLocalTx)
	return p.SendInTransaction(ctx, txID, msg, func(ctx context.Context) error {
		ctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		return l.local(ctx, p.group, txID, business)
	}, opts...)
}

func (l *TxLog) local(ctx context.Context, group, txID string, business func(ctx context.Context, tx *sql.Tx) error) error {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("txmq: local transaction %s: begin: %w", txID, err)
	}
	// After a commit this does nothing.
	defer func() { _ = tx.Rollback() }()
	// The row first: its key is then locked for the whole transaction, so
	// a check-back that wants to fence the ID waits for this commit.
	first, err := l.insert(ctx, tx, group, txID, TxCommitted)
	if err != nil {
		return fmt.Errorf("txmq: local transaction %s: %w", txID, err)
	}
	if !first {
		st, err := l.status(ctx, tx, group, txID)
		if err != nil {
			return fmt.Errorf("txmq: local transaction %s: %w", txID, err)
		}
		if st == TxCommitted {
			// A retry after a crash: the first run committed.
			return nil
		}
		return fmt.Errorf("txmq: local transaction %s: %w", txID, errFenced)
	}
	if err := business(ctx, tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("txmq: local transaction %s: %w: commit: %w", txID, ErrOutcomeUnknown, err)
	}
	return nil
}

// Check is a Checker that answers from the transaction-log table: Commit
// when the row says committed; Rollback when it says rolled back, or when
// there is none and the half message is older than MaxLocalTx, after
// writing a rolled-back row so that a local transaction still running
// fails on the key instead of committing; Unknown otherwise.
func (l *TxLog) Check(ctx context.Context, m HalfMessage) (Resolution, error) {
	st, err := l.status(ctx, l.db, m.ProducerGroup, m.TransactionID)
	if err != nil {
		return Unknown, fmt.Errorf("txmq: check %s: %w", m.TransactionID, err)
	}
	if st == "" {
		if m.CreatedAt.IsZero() || time.Since(m.CreatedAt) < l.maxLocalTx {
			return Unknown, nil
		}
		if _, err := l.insert(ctx, l.db, m.ProducerGroup, m.TransactionID, TxRolledBack); err != nil {
			return Unknown, fmt.Errorf("txmq: check %s: fence: %w", m.TransactionID, err)
		}
		// The fence or a local transaction's row, whichever came first.
		if st, err = l.status(ctx, l.db, m.ProducerGroup, m.TransactionID); err != nil {
			return Unknown, fmt.Errorf("txmq: check %s: %w", m.TransactionID, err)
		}
	}
	switch st {
	case TxCommitted:
		return Commit, nil
	case TxRolledBack:
		return Rollback, nil
	}
	return Unknown, fmt.Errorf("txmq: check %s: status %q in %s is neither %q nor %q", m.TransactionID, st, l.table, TxCommitted, TxRolledBack)
}

func (l *TxLog) insert(ctx context.Context, ex Execer, group, txID, status string) (bool, error) {
	q := l.dialect.InsertIgnore(l.table, "producer_group, tx_id, status, created_at", 4)
	res, err := ex.ExecContext(ctx, q, group, txID, status, time.Now().UnixMilli())
	if err != nil {
		return false, fmt.Errorf("insert into %s: %w", l.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, fmt.Errorf("insert into %s: %w", l.table, err)
	}
	return n == 1, nil
}

// status reads the row's status, "" when there is none.
func (l *TxLog) status(ctx context.Context, q Querier, group, txID string) (string, error) {
	var st string
	err := q.QueryRowContext(ctx, l.dialect.Rebind(`SELECT status FROM `+l.table+` WHERE producer_group = ? AND tx_id = ?`), group, txID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", l.table, err)
	}
	return st, nil
}
