package dbtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync"

	"modernc.org/sqlite"
)

// SQLite has no connection to cut, so its "commit whose outcome is
// unknown" is a driver that fails one COMMIT, armed like commitProxy:
// after or instead of committing.
func init() { sql.Register("sqlite-cut", cutDriver{}) }

var sqliteCut struct {
	mu    sync.Mutex
	armed cutMode
}

func armSQLiteCut(m cutMode) {
	sqliteCut.mu.Lock()
	defer sqliteCut.mu.Unlock()
	sqliteCut.armed = m
}

func takeSQLiteCut() cutMode {
	sqliteCut.mu.Lock()
	defer sqliteCut.mu.Unlock()
	m := sqliteCut.armed
	sqliteCut.armed = 0
	return m
}

var errConnLost = errors.New("connection lost during COMMIT")

type cutDriver struct{}

func (cutDriver) Open(dsn string) (driver.Conn, error) {
	c, err := (&sqlite.Driver{}).Open(dsn)
	if err != nil {
		return nil, err
	}
	return &cutConn{Conn: c}, nil
}

// cutConn passes everything to the SQLite connection, wrapping its
// transactions.
type cutConn struct{ driver.Conn }

func (c *cutConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &cutTx{Tx: tx}, nil
}

func (c *cutConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *cutConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *cutConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

type cutTx struct{ driver.Tx }

func (t *cutTx) Commit() error {
	switch takeSQLiteCut() {
	case cutBeforeCommit:
		_ = t.Tx.Rollback()
		return errConnLost
	case cutAfterCommit:
		if err := t.Tx.Commit(); err != nil {
			return err
		}
		return errConnLost
	}
	return t.Tx.Commit()
}
