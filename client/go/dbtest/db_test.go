package dbtest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	_ "modernc.org/sqlite"

	txmq "github.com/txmq/txmq/client/go"
)

const (
	postgresEnv = "TXMQ_TEST_POSTGRES_DSN"
	mysqlEnv    = "TXMQ_TEST_MYSQL_DSN"
)

// testDB is one fresh, empty database of one kind, dropped when the test
// ends.
type testDB struct {
	name    string
	dialect txmq.Dialect
	// dsn opens the database; connect opens it through addr (a proxy)
	// instead of the server's own address.
	dsn     string
	connect func(addr string) string
	server  string // host:port of the server, "" for SQLite
	driver  string
}

func (d *testDB) open(t *testing.T) *sql.DB {
	t.Helper()
	return d.openDSN(t, d.dsn)
}

func (d *testDB) openDSN(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(d.driver, dsn)
	require.NoError(t, err)
	if d.dialect == txmq.SQLite {
		// Enough connections to race, and busy_timeout makes writers wait
		// for SQLite's one write lock instead of failing.
		db.SetMaxOpenConns(8)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// forEachDB runs f once per database: SQLite always, PostgreSQL and MySQL
// when their DSNs are set. A missing DSN skips, with the variable's name,
// only outside CI; under CI it fails.
func forEachDB(t *testing.T, f func(t *testing.T, d *testDB)) {
	for _, kind := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			f(t, newTestDB(t, kind))
		})
	}
}

func newTestDB(t *testing.T, kind string) *testDB {
	t.Helper()
	name := "t_" + randomHex(6)
	switch kind {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "test.db")
		return &testDB{name: "sqlite", dialect: txmq.SQLite, driver: "sqlite",
			dsn: "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"}
	case "postgres":
		base := serverDSN(t, postgresEnv)
		u, err := url.Parse(base)
		require.NoError(t, err)
		admin := openAdmin(t, "pgx", base)
		_, err = admin.Exec(`CREATE DATABASE ` + name)
		require.NoError(t, err)
		t.Cleanup(func() { dropDatabase(t, admin, `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`) })
		u.Path = "/" + name
		server := u.Host
		connect := func(addr string) string { c := *u; c.Host = addr; return c.String() }
		return &testDB{name: "postgres", dialect: txmq.Postgres, driver: "pgx", dsn: u.String(), connect: connect, server: server}
	case "mysql":
		base := serverDSN(t, mysqlEnv)
		cfg, err := mysql.ParseDSN(base)
		require.NoError(t, err)
		admin := openAdmin(t, "mysql", base)
		_, err = admin.Exec(`CREATE DATABASE ` + name)
		require.NoError(t, err)
		t.Cleanup(func() { dropDatabase(t, admin, `DROP DATABASE IF EXISTS `+name) })
		cfg.DBName = name
		server := cfg.Addr
		connect := func(addr string) string { c := cfg.Clone(); c.Addr = addr; return c.FormatDSN() }
		return &testDB{name: "mysql", dialect: txmq.MySQL, driver: "mysql", dsn: cfg.FormatDSN(), connect: connect, server: server}
	}
	t.Fatalf("unknown database kind %q", kind)
	return nil
}

func serverDSN(t *testing.T, env string) string {
	t.Helper()
	dsn := os.Getenv(env)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set, and CI is: .ci/run starts the database servers (scripts/ci-databases.sh)", env)
		}
		t.Skipf("%s is not set: no server of this kind to test against (scripts/ci-databases.sh starts one)", env)
	}
	return dsn
}

func openAdmin(t *testing.T, driver, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driver, dsn)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, db.PingContext(ctx), "the server in the DSN must be up")
	t.Cleanup(func() { db.Close() })
	return db
}

func dropDatabase(t *testing.T, admin *sql.DB, stmt string) {
	if _, err := admin.Exec(stmt); err != nil {
		t.Logf("%s: %v", stmt, err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// exec runs statements, failing the test on the first error.
func exec(t *testing.T, db *sql.DB, stmts ...string) {
	t.Helper()
	for _, s := range stmts {
		_, err := db.ExecContext(t.Context(), s)
		require.NoError(t, err, s)
	}
}

func queryInt(t *testing.T, db *sql.DB, d txmq.Dialect, q string, args ...any) int64 {
	t.Helper()
	var n sql.NullInt64
	require.NoError(t, db.QueryRowContext(t.Context(), d.Rebind(q), args...).Scan(&n), q)
	return n.Int64
}

// waiting is a condition for txmqtest.CheckFor: cond holds, or the test
// is still waiting for what.
func waiting(what string, cond func() bool) func() error {
	return func() error {
		if !cond() {
			return errors.New("waiting for " + what)
		}
		return nil
	}
}

func bodyOf(s string, args ...any) []byte { return []byte(fmt.Sprintf(s, args...)) }
