// Package dbtest holds the tests of the client's database helpers
// (txmq.TxLog, txmq.ProcessOnce, the outbox relay) against real databases:
// SQLite always, PostgreSQL and MySQL/MariaDB when TXMQ_TEST_POSTGRES_DSN
// and TXMQ_TEST_MYSQL_DSN name servers (scripts/ci-databases.sh starts
// them). It is a module of its own so that the drivers stay out of the
// root go.mod: the client itself uses only database/sql.
package dbtest
