package outbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	txmq "github.com/txmq/txmq/client/go"
)

type nopSender struct{}

func (nopSender) Send(context.Context, txmq.Message) (txmq.SendResult, error) {
	return txmq.SendResult{}, nil
}

// The statements differ where the dialects do; the database tests are in
// client/go/dbtest.
func TestDDLPerDialect(t *testing.T) {
	pg := Table{Dialect: txmq.Postgres}.DDL()
	require.Len(t, pg, 2)
	require.Contains(t, pg[0], "BIGSERIAL PRIMARY KEY")
	require.Contains(t, pg[0], "body              BYTEA NOT NULL")
	require.Equal(t, "CREATE INDEX IF NOT EXISTS txmq_outbox_due ON txmq_outbox (status, next_retry_at)", pg[1])
	my := Table{Dialect: txmq.MySQL, Name: "order_outbox"}.DDL()
	require.Len(t, my, 1, "MySQL has no CREATE INDEX IF NOT EXISTS: the index is in the table")
	require.Contains(t, my[0], "INDEX order_outbox_due (status, next_retry_at)")
	require.Contains(t, my[0], "LONGBLOB")
	require.True(t, strings.HasPrefix(Table{Dialect: txmq.SQLite}.DDL()[0], "CREATE TABLE IF NOT EXISTS txmq_outbox"))
}

func TestRelayConfig(t *testing.T) {
	_, err := NewRelay(RelayConfig{Table: Table{Dialect: txmq.SQLite}, Sender: nopSender{}})
	require.ErrorIs(t, err, ErrInvalid, "no DB")
	cfg := RelayConfig{Table: Table{Dialect: txmq.SQLite}, Sender: nopSender{}}
	require.NoError(t, defaults(&cfg))
	require.Equal(t, 100, cfg.BatchSize)
	require.Equal(t, 8, cfg.MaxAttempts)
	require.Equal(t, DefaultBackoff, cfg.Backoff)
	require.Equal(t, time.Minute, cfg.SendingTimeout)
	require.Equal(t, 72*time.Hour, cfg.Retention)
	bad := RelayConfig{Backoff: []time.Duration{-time.Second}}
	require.ErrorIs(t, defaults(&bad), ErrInvalid)
	bad = RelayConfig{PollInterval: -1}
	require.ErrorIs(t, defaults(&bad), ErrInvalid)
	require.ErrorIs(t, Table{}.Write(t.Context(), nil, Message{}), txmq.ErrInvalidArgument, "no dialect")
}
