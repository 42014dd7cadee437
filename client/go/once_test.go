package txmq

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// recordDB is a database/sql driver just good enough for ProcessOnce: a
// transaction's inserts into the record set become visible on commit, an
// insert of a pair that is there affects no row, and every statement is
// logged. Other statements (apply's) are only logged.
type recordDB struct {
	mu      sync.Mutex
	records map[string]bool
	log     []string
	// affected, when set, replaces the rows an insert affected.
	affected func(n int64) int64
}

var recordDBs sync.Map // DSN -> *recordDB

func init() { sql.Register("txmq-records", recordDriver{}) }

type recordDriver struct{}

func (recordDriver) Open(dsn string) (driver.Conn, error) {
	db, ok := recordDBs.Load(dsn)
	if !ok {
		return nil, fmt.Errorf("no database %q", dsn)
	}
	return &recordConn{db: db.(*recordDB)}, nil
}

type recordConn struct {
	db      *recordDB
	pending []string // records inserted by the open transaction
}

func (c *recordConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (c *recordConn) Close() error                        { return nil }
func (c *recordConn) Begin() (driver.Tx, error)           { return c, nil }

func (c *recordConn) note(s string) {
	c.db.mu.Lock()
	defer c.db.mu.Unlock()
	c.db.log = append(c.db.log, s)
}

func (c *recordConn) Commit() error {
	c.db.mu.Lock()
	defer c.db.mu.Unlock()
	for _, k := range c.pending {
		c.db.records[k] = true
	}
	c.pending = nil
	c.db.log = append(c.db.log, "COMMIT")
	return nil
}

func (c *recordConn) Rollback() error {
	c.pending = nil
	c.note("ROLLBACK")
	return nil
}

func (c *recordConn) ExecContext(_ context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	var vals []any
	for _, a := range args {
		vals = append(vals, a.Value)
	}
	c.note(fmt.Sprintf("%s %v", query, vals))
	if query == "apply" {
		return driver.RowsAffected(1), nil
	}
	key := fmt.Sprint(vals...)
	c.db.mu.Lock()
	defer c.db.mu.Unlock()
	var n int64
	if !c.db.records[key] && !slices.Contains(c.pending, key) {
		c.pending = append(c.pending, key)
		n = 1
	}
	if c.db.affected != nil {
		n = c.db.affected(n)
	}
	return driver.RowsAffected(n), nil
}

func openRecordDB(t *testing.T) (*sql.DB, *recordDB) {
	t.Helper()
	rdb := &recordDB{records: map[string]bool{}}
	recordDBs.Store(t.Name(), rdb)
	t.Cleanup(func() { recordDBs.Delete(t.Name()) })
	db, err := sql.Open("txmq-records", t.Name())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db, rdb
}

func (r *recordDB) Log() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log)
}

func applyStatement(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, "apply")
	return err
}

func TestProcessOnce(t *testing.T) {
	db, rdb := openRecordDB(t)
	d := &Delivery{MessageID: "m-1", Group: "points"}
	record := DefaultRecordInsert + " [points m-1]"

	applied, err := ProcessOnce(t.Context(), db, d, applyStatement)
	require.NoError(t, err)
	require.True(t, applied)
	require.Equal(t, []string{record, "apply []", "COMMIT"}, rdb.Log())

	for range 3 {
		applied, err = ProcessOnce(t.Context(), db, d, func(context.Context, *sql.Tx) error {
			t.Fatal("applied twice")
			return nil
		})
		require.NoError(t, err)
		require.False(t, applied)
	}
	require.Equal(t, []string{record, "apply []", "COMMIT", record, "ROLLBACK", record, "ROLLBACK", record, "ROLLBACK"}, rdb.Log())

	other := &Delivery{MessageID: "m-1", Group: "audit"}
	applied, err = ProcessOnce(t.Context(), db, other, applyStatement)
	require.NoError(t, err)
	require.True(t, applied, "each group applies the message once")
}

func TestProcessOnceKeepsNothingWhenApplyFails(t *testing.T) {
	db, rdb := openRecordDB(t)
	d := &Delivery{MessageID: "m-1", Group: "points"}
	boom := errors.New("points table locked")
	applied, err := ProcessOnce(t.Context(), db, d, func(context.Context, *sql.Tx) error { return boom })
	require.ErrorIs(t, err, boom)
	require.False(t, applied)
	require.Equal(t, []string{DefaultRecordInsert + " [points m-1]", "ROLLBACK"}, rdb.Log())

	applied, err = ProcessOnce(t.Context(), db, d, applyStatement)
	require.NoError(t, err)
	require.True(t, applied, "the failed attempt left no record")
}

func TestProcessOnceOptionsAndErrors(t *testing.T) {
	db, rdb := openRecordDB(t)
	d := &Delivery{MessageID: "m-1", Group: "points"}
	const mysql = "INSERT IGNORE INTO consumer_record (consumer_group, message_id) VALUES (?, ?)"
	applied, err := ProcessOnce(t.Context(), db, d, applyStatement, WithRecordInsert(mysql))
	require.NoError(t, err)
	require.True(t, applied)
	require.Equal(t, mysql+" [points m-1]", rdb.Log()[0])

	rdb.affected = func(int64) int64 { return 2 }
	_, err = ProcessOnce(t.Context(), db, &Delivery{MessageID: "m-2", Group: "points"}, applyStatement)
	require.ErrorContains(t, err, "affected 2 rows")

	for name, call := range map[string]func() error{
		"nil db":       func() error { _, err := ProcessOnce(t.Context(), nil, d, applyStatement); return err },
		"nil apply":    func() error { _, err := ProcessOnce(t.Context(), db, d, nil); return err },
		"nil delivery": func() error { _, err := ProcessOnce(t.Context(), db, nil, applyStatement); return err },
		"no group": func() error {
			_, err := ProcessOnce(t.Context(), db, &Delivery{MessageID: "m"}, applyStatement)
			return err
		},
	} {
		require.ErrorIs(t, call(), ErrInvalidArgument, name)
	}
}

// ProcessOnce's statements must reach ExecContext, not Prepare.
var _ driver.ExecerContext = (*recordConn)(nil)

// A held connection and a transaction the caller owns record the same way.
func TestProcessOnceOnConnAndInTx(t *testing.T) {
	db, rdb := openRecordDB(t)
	conn, err := db.Conn(t.Context())
	require.NoError(t, err)
	defer conn.Close()
	d := &Delivery{MessageID: "m-1", Group: "points"}
	record := DefaultRecordInsert + " [points m-1]"
	applied, err := ProcessOnce(t.Context(), conn, d, applyStatement)
	require.NoError(t, err)
	require.True(t, applied)

	tx, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	applied, err = ProcessOnceInTx(t.Context(), tx, d, func(context.Context) error {
		t.Fatal("applied twice")
		return nil
	})
	require.NoError(t, err)
	require.False(t, applied)
	require.NoError(t, tx.Commit())

	tx, err = db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	second := &Delivery{MessageID: "m-2", Group: "points"}
	applied, err = ProcessOnceInTx(t.Context(), tx, second, func(ctx context.Context) error {
		_, err := tx.ExecContext(ctx, "apply")
		return err
	})
	require.NoError(t, err)
	require.True(t, applied)
	require.NoError(t, tx.Commit())
	require.Equal(t, []string{record, "apply []", "COMMIT", record, "COMMIT",
		DefaultRecordInsert + " [points m-2]", "apply []", "COMMIT"}, rdb.Log())

	_, err = ProcessOnceInTx(t.Context(), nil, d, func(context.Context) error { return nil })
	require.ErrorIs(t, err, ErrInvalidArgument)
}

func TestDialectStatements(t *testing.T) {
	require.Equal(t, "INSERT INTO consumer_record (consumer_group, message_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
		Postgres.InsertIgnore("consumer_record", "consumer_group, message_id", 2))
	require.Equal(t, DefaultRecordInsert, Postgres.InsertIgnore("consumer_record", "consumer_group, message_id", 2))
	require.Equal(t, "INSERT IGNORE INTO t (a, b, c) VALUES (?, ?, ?)", MySQL.InsertIgnore("t", "a, b, c", 3))
	require.Equal(t, "INSERT INTO t (a) VALUES (?) ON CONFLICT DO NOTHING", SQLite.InsertIgnore("t", "a", 1))
	require.Equal(t, "SELECT a FROM t WHERE b = $1 AND c < $2", Postgres.Rebind("SELECT a FROM t WHERE b = ? AND c < ?"))
	require.Equal(t, "SELECT ?", SQLite.Rebind("SELECT ?"))
	require.NoError(t, MySQL.Check())
	require.ErrorIs(t, Dialect(0).Check(), ErrInvalidArgument)
	require.Equal(t, "Dialect(9)", Dialect(9).String())

	db, rdb := openRecordDB(t)
	_, err := ProcessOnce(t.Context(), db, &Delivery{MessageID: "m-1", Group: "points"}, applyStatement, WithDialect(MySQL))
	require.NoError(t, err)
	require.Equal(t, "INSERT IGNORE INTO consumer_record (consumer_group, message_id) VALUES (?, ?) [points m-1]", rdb.Log()[0])
}
