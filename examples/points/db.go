package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	// The database drivers: pure Go, so the example builds without a C
	// compiler. SQLite registers as "sqlite", pgx as "pgx".
	_ "github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite"

	txmq "github.com/txmq/txmq/client/go"
)

// openDB opens a database named by --dsn: postgres://... (PostgreSQL),
// mysql://user:pass@tcp(host:port)/db (MySQL or MariaDB, in
// go-sql-driver/mysql's form after the prefix), or a SQLite file path.
func openDB(ctx context.Context, dsn string) (*sql.DB, txmq.Dialect, error) {
	var (
		driver, source string
		dialect        txmq.Dialect
	)
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		driver, source, dialect = "pgx", dsn, txmq.Postgres
	case strings.HasPrefix(dsn, "mysql://"):
		driver, source, dialect = "mysql", strings.TrimPrefix(dsn, "mysql://"), txmq.MySQL
	default:
		path := strings.TrimPrefix(dsn, "sqlite://")
		driver, dialect = "sqlite", txmq.SQLite
		source = "file:" + path + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	}
	db, err := sql.Open(driver, source)
	if err != nil {
		return nil, 0, err
	}
	if dialect == txmq.SQLite {
		// SQLite has one writer at a time; one connection makes writers
		// take turns instead of failing with SQLITE_BUSY.
		db.SetMaxOpenConns(1)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, 0, fmt.Errorf("open %s: %w", dialect, err)
	}
	return db, dialect, nil
}

// autoID is the dialect's auto-increment primary key column type.
func autoID(d txmq.Dialect) string {
	switch d {
	case txmq.Postgres:
		return "BIGSERIAL PRIMARY KEY"
	case txmq.MySQL:
		return "BIGINT AUTO_INCREMENT PRIMARY KEY"
	}
	return "INTEGER PRIMARY KEY AUTOINCREMENT"
}

func execAll(ctx context.Context, db *sql.DB, stmts ...string) error {
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("%s: %w", strings.SplitN(s, "(", 2)[0], err)
		}
	}
	return nil
}
