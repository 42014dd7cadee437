package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/client/go/outbox"
	"github.com/txmq/txmq/internal/txmqtest"
)

// watchedSender sends through a producer and records, per message key, how
// often it was sent and whether two sends of it ever overlapped.
type watchedSender struct {
	next outbox.Sender
	fail func(msg txmq.Message) error

	mu       sync.Mutex
	inFlight map[string]bool
	sends    map[string]int
	overlaps []string
}

func watch(next outbox.Sender) *watchedSender {
	return &watchedSender{next: next, inFlight: map[string]bool{}, sends: map[string]int{}}
}

func (w *watchedSender) Send(ctx context.Context, msg txmq.Message) (txmq.SendResult, error) {
	w.mu.Lock()
	if w.inFlight[msg.Key] {
		w.overlaps = append(w.overlaps, msg.Key)
	}
	w.inFlight[msg.Key] = true
	w.sends[msg.Key]++
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.inFlight, msg.Key)
		w.mu.Unlock()
	}()
	if w.fail != nil {
		if err := w.fail(msg); err != nil {
			return txmq.SendResult{}, err
		}
	}
	return w.next.Send(ctx, msg)
}

func (w *watchedSender) report() (sends, maxPerKey int, overlaps []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.sends {
		sends += n
		maxPerKey = max(maxPerKey, n)
	}
	return sends, maxPerKey, append([]string(nil), w.overlaps...)
}

func newOutbox(t *testing.T, d *testDB, db *sql.DB) outbox.Table {
	t.Helper()
	tbl := outbox.Table{Dialect: d.dialect}
	require.NoError(t, tbl.CreateTable(t.Context(), db))
	return tbl
}

// writeRows writes n messages into the outbox, 1,000 to a transaction.
func writeRows(t *testing.T, db *sql.DB, tbl outbox.Table, topic string, n int) {
	t.Helper()
	for start := 0; start < n; start += 1000 {
		tx, err := db.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		for i := start; i < min(n, start+1000); i++ {
			require.NoError(t, tbl.Write(t.Context(), tx, outbox.Message{ID: fmt.Sprintf("order-%d:paid", i), Topic: topic, Body: bodyOf("order %d", i)}))
		}
		require.NoError(t, tx.Commit())
	}
}

func countStatus(t *testing.T, d *testDB, db *sql.DB, status string) int64 {
	return queryInt(t, db, d.dialect, `SELECT COUNT(*) FROM txmq_outbox WHERE status = ?`, status)
}

func runRelay(t *testing.T, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	r, err := outbox.NewRelay(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// Three relays drain 10,000 rows: every row is SENT, the broker holds each
// message once, and no row is ever sent by two relays at once.
func TestOutboxThreeRelays(t *testing.T) {
	const rows = 10_000
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		tbl := newOutbox(t, d, db)
		topic := "outbox-" + d.name
		writeRows(t, db, tbl, topic, rows)
		// Three instances, each with its own database pool and producer.
		sender := watch(rb.producer(t, txmq.ProducerConfig{}))
		start := time.Now()
		for i := range 3 {
			runRelay(t, outbox.RelayConfig{DB: d.open(t), Table: tbl, Sender: sender, BatchSize: 200,
				PollInterval: 50 * time.Millisecond, Concurrency: 16, InstanceID: fmt.Sprint("relay-", i)})
		}
		txmqtest.CheckFor(t, 3*time.Minute, 20*time.Millisecond, waiting("every row SENT", func() bool { return countStatus(t, d, db, outbox.StatusSent) == rows }))
		took := time.Since(start)
		sends, maxPerKey, overlaps := sender.report()
		require.Empty(t, overlaps, "rows sent by two relays at once")
		require.Equal(t, 1, maxPerKey, "no row sent twice")
		require.Equal(t, rows, sends)
		require.Equal(t, uint64(rows), rb.topicMessages(topic), "the broker holds each message once")
		require.Equal(t, int64(rows), queryInt(t, db, d.dialect, `SELECT COUNT(DISTINCT broker_message_id) FROM txmq_outbox`))
		t.Logf("%s: 3 relays sent %d rows in %v (%.0f rows/s)", d.name, rows, took.Round(time.Millisecond), rows/took.Seconds())
	})
}

// With the broker down, sends fail and rows back off (retry_count,
// next_retry_at, last_error); once it is back they are all sent.
func TestOutboxBrokerDown(t *testing.T) {
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		tbl := newOutbox(t, d, db)
		topic := "outbox-down-" + d.name
		writeRows(t, db, tbl, topic, 50)
		rb.stop()
		p := rb.producer(t, txmq.ProducerConfig{RetryTimeout: 100 * time.Millisecond})
		reg := prometheus.NewRegistry()
		r, err := outbox.NewRelay(outbox.RelayConfig{DB: db, Table: tbl, Sender: p, Logger: quiet, Registerer: reg,
			Backoff: []time.Duration{2 * time.Second}, MaxAttempts: 100})
		require.NoError(t, err)
		res, err := r.Scan(t.Context())
		require.NoError(t, err)
		require.Equal(t, outbox.ScanResult{Claimed: 50, Retried: 50}, res)
		before := time.Now()
		for _, row := range rowsIn(t, tbl, db, outbox.StatusPending) {
			require.Equal(t, 1, row.RetryCount)
			require.True(t, row.NextRetryAt.After(before), "backed off")
			require.Contains(t, row.LastError, "unavailable")
		}
		res, err = r.Scan(t.Context())
		require.NoError(t, err)
		require.Zero(t, res.Claimed, "nothing is due during the backoff")
		require.Equal(t, 50.0, testutil.ToFloat64(r.Metrics().SendErrors))
		st, err := r.Stats(t.Context())
		require.NoError(t, err)
		require.Equal(t, int64(50), st.Backlog)
		require.Positive(t, st.OldestPending)

		rb.start()
		txmqtest.CheckFor(t, 30*time.Second, 20*time.Millisecond, waiting("the rows to be sent after the broker returned", func() bool {
			_, err := r.Scan(t.Context())
			require.NoError(t, err)
			return countStatus(t, d, db, outbox.StatusSent) == 50
		}))
		require.Equal(t, uint64(50), rb.topicMessages(topic))
		require.Equal(t, 50.0, testutil.ToFloat64(r.Metrics().Sent))
	})
}

func rowsIn(t *testing.T, tbl outbox.Table, db *sql.DB, status string) []outbox.Row {
	t.Helper()
	rows, err := tbl.Rows(t.Context(), db, status, 1000)
	require.NoError(t, err)
	require.NotEmpty(t, rows)
	return rows
}

// A row whose send fails 8 times is parked as FAILED with its last error;
// the others are sent.
func TestOutboxParksAfterMaxAttempts(t *testing.T) {
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		tbl := newOutbox(t, d, db)
		topic := "outbox-park-" + d.name
		writeRows(t, db, tbl, topic, 3)
		sender := watch(rb.producer(t, txmq.ProducerConfig{}))
		sender.fail = func(msg txmq.Message) error {
			if msg.Key == "order-1:paid" {
				return errors.New("points service rejected order-1")
			}
			return nil
		}
		r, err := outbox.NewRelay(outbox.RelayConfig{DB: db, Table: tbl, Sender: sender, Logger: quiet, Backoff: []time.Duration{time.Millisecond}})
		require.NoError(t, err)
		txmqtest.CheckFor(t, 20*time.Second, 20*time.Millisecond, waiting("order-1 parked", func() bool {
			_, err := r.Scan(t.Context())
			require.NoError(t, err)
			return countStatus(t, d, db, outbox.StatusFailed) == 1
		}))
		failed := rowsIn(t, tbl, db, outbox.StatusFailed)
		require.Len(t, failed, 1)
		require.Equal(t, "order-1:paid", failed[0].MsgID)
		require.Equal(t, 8, failed[0].RetryCount)
		require.Equal(t, "points service rejected order-1", failed[0].LastError)
		require.Equal(t, int64(2), countStatus(t, d, db, outbox.StatusSent))
		require.Equal(t, 1.0, testutil.ToFloat64(r.Metrics().Parked))
		res, err := r.Scan(t.Context())
		require.NoError(t, err)
		require.Zero(t, res.Claimed, "a parked row is not sent again")
		sends, _, _ := sender.report()
		require.Equal(t, 8+2, sends)
	})
}

// A relay that died between the broker's answer and the SENT update left
// its row SENDING: after SendingTimeout another relay sends it again, and
// the dedup key gives it its first message ID. SENT rows past the
// retention are deleted.
func TestOutboxResendAfterCrashAndRetention(t *testing.T) {
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		tbl := newOutbox(t, d, db)
		topic := "outbox-crash-" + d.name
		writeRows(t, db, tbl, topic, 1)
		p := rb.producer(t, txmq.ProducerConfig{})
		first, err := p.Send(t.Context(), txmq.Message{Topic: topic, Key: "order-0:paid", Body: bodyOf("order 0")})
		require.NoError(t, err)
		old := time.Now().Add(-time.Hour).UnixMilli()
		exec(t, db, fmt.Sprintf(`UPDATE txmq_outbox SET status = 'SENDING', claimed_by = 'dead-relay', claimed_at = %d`, old))

		r, err := outbox.NewRelay(outbox.RelayConfig{DB: db, Table: tbl, Sender: p, Logger: quiet,
			SendingTimeout: time.Minute, Retention: time.Minute})
		require.NoError(t, err)
		res, err := r.Scan(t.Context())
		require.NoError(t, err)
		require.Equal(t, outbox.ScanResult{Reset: 1, Claimed: 1, Sent: 1}, res)
		sent := rowsIn(t, tbl, db, outbox.StatusSent)
		require.Equal(t, first.MessageID, sent[0].BrokerMessageID, "the resend got the first message ID")
		require.Equal(t, uint64(1), rb.topicMessages(topic))

		exec(t, db, fmt.Sprintf(`UPDATE txmq_outbox SET updated_at = %d`, old))
		r, err = outbox.NewRelay(outbox.RelayConfig{DB: db, Table: tbl, Sender: p, Logger: quiet, Retention: time.Minute})
		require.NoError(t, err)
		res, err = r.Scan(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, res.Pruned)
		require.Zero(t, queryInt(t, db, d.dialect, `SELECT COUNT(*) FROM txmq_outbox`))
	})
}

// Write keeps a message ID once, and leaves the transaction usable.
func TestOutboxWriteDuplicate(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		tbl := newOutbox(t, d, db)
		tx, err := db.BeginTx(t.Context(), nil)
		require.NoError(t, err)
		defer tx.Rollback()
		m := outbox.Message{ID: "order-1:paid", Topic: "orders", Body: []byte("x"), Properties: map[string]string{"source": "web"}}
		require.NoError(t, tbl.Write(t.Context(), tx, m))
		require.ErrorIs(t, tbl.Write(t.Context(), tx, m), outbox.ErrDuplicate)
		require.ErrorIs(t, tbl.Write(t.Context(), tx, outbox.Message{ID: "x", Topic: "orders"}), outbox.ErrInvalid)
		require.NoError(t, tx.Commit())
		require.Equal(t, int64(1), countStatus(t, d, db, outbox.StatusPending))
	})
}
