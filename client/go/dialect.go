package txmq

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"
)

// Dialect names the SQL database behind a *sql.DB, for the helpers that
// write SQL of their own (ProcessOnce, TxLog, the outbox and reconcile
// packages): placeholders, insert-or-ignore, row locks and column types
// differ. It is chosen by the caller, never guessed from the driver.
type Dialect int

const (
	// Postgres is PostgreSQL 9.5 or later ($1 placeholders, ON CONFLICT DO
	// NOTHING, FOR UPDATE SKIP LOCKED).
	Postgres Dialect = iota + 1
	// MySQL is MySQL 8 or MariaDB 10.6 or later (? placeholders, INSERT
	// IGNORE, FOR UPDATE SKIP LOCKED).
	MySQL
	// SQLite is SQLite 3.24 or later (? placeholders, ON CONFLICT DO
	// NOTHING, no row locks: one writer at a time).
	SQLite
)

func (d Dialect) String() string {
	switch d {
	case Postgres:
		return "postgres"
	case MySQL:
		return "mysql"
	case SQLite:
		return "sqlite"
	}
	return fmt.Sprintf("Dialect(%d)", int(d))
}

// Check reports a Dialect that is none of the three.
func (d Dialect) Check() error {
	if d < Postgres || d > SQLite {
		return invalidf("dialect %v is not Postgres, MySQL or SQLite", d)
	}
	return nil
}

// Rebind turns the ? placeholders of query into $1, $2, ... for Postgres
// and leaves them as they are for the others. query must hold no other
// question mark (in a string literal, say).
func (d Dialect) Rebind(query string) string {
	if d != Postgres {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// InsertIgnore is "INSERT INTO table (columns) VALUES (?, ...)" that
// affects no row, rather than failing, when the row conflicts with a unique
// key, with placeholders for the dialect.
func (d Dialect) InsertIgnore(table, columns string, n int) string {
	values := strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
	if d == MySQL {
		return fmt.Sprintf("INSERT IGNORE INTO %s (%s) VALUES (%s)", table, columns, values)
	}
	return d.Rebind(fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s) ON CONFLICT DO NOTHING", table, columns, values))
}

// Execer runs a statement: *sql.DB, *sql.Conn and *sql.Tx all are.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Querier runs statements and queries: *sql.DB, *sql.Conn and *sql.Tx all
// are.
type Querier interface {
	Execer
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// TxBeginner starts a database transaction: *sql.DB and *sql.Conn are.
type TxBeginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}
