package outbox

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	txmq "github.com/txmq/txmq/client/go"
)

// Sender sends a message to the broker: *txmq.Producer is one.
type Sender interface {
	Send(ctx context.Context, msg txmq.Message) (txmq.SendResult, error)
}

// DefaultBackoff is the wait after the 1st, 2nd, ... failed send of a row;
// the last one repeats. Past ten minutes retrying seldom helps: an alert
// does (seed 000).
var DefaultBackoff = []time.Duration{10 * time.Second, 30 * time.Second, time.Minute, 5 * time.Minute, 10 * time.Minute}

// RelayConfig configures a Relay. The zero value of every field but DB,
// Table.Dialect and Sender has a usable default.
type RelayConfig struct {
	DB     *sql.DB
	Table  Table
	Sender Sender
	// BatchSize is how many due rows one scan claims. Default 100.
	BatchSize int
	// PollInterval is the wait between scans that found fewer rows than
	// BatchSize. Default 1 s.
	PollInterval time.Duration
	// Concurrency is how many sends of a batch run at once. Default 8.
	Concurrency int
	// Backoff is the wait after each failed send. Default DefaultBackoff.
	Backoff []time.Duration
	// MaxAttempts is how many failed sends park a row as FAILED. Default 8.
	MaxAttempts int
	// SendingTimeout is how long a row may stay SENDING before the relay
	// takes it to have died and makes it PENDING again. It must be longer
	// than a send can take. Default 1 min.
	SendingTimeout time.Duration
	// Retention is how long SENT rows are kept before they are deleted.
	// Default 72 h, the broker's retention; negative keeps them.
	Retention time.Duration
	// SendTimeout bounds one send. Default 30 s.
	SendTimeout time.Duration
	// InstanceID names this relay in claimed_by. Default random.
	InstanceID string
	// Logger receives the relay's logs. Default slog.Default().
	Logger *slog.Logger
	// Registerer, when set, gets the relay's metrics (see NewRelay).
	Registerer prometheus.Registerer
}

// Relay sends the rows of an outbox table to the broker. Run it in every
// instance of the service: the claims keep them apart.
type Relay struct {
	cfg RelayConfig
	log *slog.Logger
	m   *Metrics

	mu        sync.Mutex // guards lastPrune, for Scans run at once
	lastPrune time.Time
}

const (
	pruneEvery = time.Minute
	statsEvery = 5 * time.Second
	maxErrText = 1024
	// recordTries bounds the tries of an outcome update (about 0.3 s).
	recordTries = 6
)

// NewRelay checks cfg and fills in its defaults. With cfg.Registerer it
// registers txmq_outbox_backlog, txmq_outbox_oldest_pending_age_seconds,
// txmq_outbox_failed_rows (gauges), txmq_outbox_sent_total,
// txmq_outbox_send_errors_total, txmq_outbox_parked_total (counters) and
// txmq_outbox_scan_duration_seconds (a histogram), each with a table label.
func NewRelay(cfg RelayConfig) (*Relay, error) {
	if cfg.DB == nil || cfg.Sender == nil {
		return nil, fmt.Errorf("%w: RelayConfig needs DB and Sender", ErrInvalid)
	}
	if err := cfg.Table.check(); err != nil {
		return nil, err
	}
	if err := defaults(&cfg); err != nil {
		return nil, err
	}
	m := newMetrics(cfg.Table.name())
	if cfg.Registerer != nil {
		if err := m.register(cfg.Registerer); err != nil {
			return nil, fmt.Errorf("outbox: register metrics: %w", err)
		}
	}
	log := cfg.Logger.With("component", "txmq-outbox", "table", cfg.Table.name(), "relay", cfg.InstanceID)
	return &Relay{cfg: cfg, log: log, m: m}, nil
}

func defaults(cfg *RelayConfig) error {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"PollInterval", cfg.PollInterval}, {"SendingTimeout", cfg.SendingTimeout}, {"SendTimeout", cfg.SendTimeout}} {
		if f.v < 0 {
			return fmt.Errorf("%w: RelayConfig.%s %v is negative", ErrInvalid, f.name, f.v)
		}
	}
	if cfg.BatchSize < 0 || cfg.Concurrency < 0 || cfg.MaxAttempts < 0 {
		return fmt.Errorf("%w: RelayConfig.BatchSize, Concurrency and MaxAttempts may not be negative", ErrInvalid)
	}
	for _, b := range cfg.Backoff {
		if b < 0 {
			return fmt.Errorf("%w: RelayConfig.Backoff holds the negative %v", ErrInvalid, b)
		}
	}
	cfg.BatchSize = orDefault(cfg.BatchSize, 100)
	cfg.Concurrency = orDefault(cfg.Concurrency, 8)
	cfg.MaxAttempts = orDefault(cfg.MaxAttempts, 8)
	cfg.PollInterval = orDefault(cfg.PollInterval, time.Second)
	cfg.SendingTimeout = orDefault(cfg.SendingTimeout, time.Minute)
	cfg.SendTimeout = orDefault(cfg.SendTimeout, 30*time.Second)
	cfg.Retention = orDefault(cfg.Retention, 72*time.Hour)
	if len(cfg.Backoff) == 0 {
		cfg.Backoff = DefaultBackoff
	}
	if cfg.InstanceID == "" {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		cfg.InstanceID = "relay-" + hex.EncodeToString(b)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return nil
}

func orDefault[T int | time.Duration](v, d T) T {
	if v == 0 {
		return d
	}
	return v
}

// Run scans until ctx ends, at once again after a full batch and after
// PollInterval otherwise. Database errors are logged and retried at the
// next poll. It returns nil when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	// The gauges are refreshed on their own: a scan can wait long on a
	// broker that is away, which is when the backlog matters.
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.statsLoop(ctx) })
	for {
		res, err := r.Scan(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			r.log.Warn("outbox scan failed; retrying at the next poll", "err", err)
		}
		if err == nil && res.Claimed == r.cfg.BatchSize {
			continue
		}
		t := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Metrics are the relay's collectors.
func (r *Relay) Metrics() *Metrics { return r.m }

// ScanResult counts what one scan did.
type ScanResult struct {
	// Reset rows were SENDING past SendingTimeout and are PENDING again.
	Reset int
	// Claimed rows were due and taken by this scan.
	Claimed int
	// Sent, Retried and Parked split the claimed rows: sent and SENT,
	// failed and PENDING again with a later next_retry_at, failed for the
	// last time and FAILED.
	Sent, Retried, Parked int
	// Pruned SENT rows were past Retention and deleted.
	Pruned int
}

// Scan runs one round: it hands back rows stuck in SENDING, claims up to
// BatchSize due rows, sends them, records each outcome, and now and then
// deletes old SENT rows.
func (r *Relay) Scan(ctx context.Context) (ScanResult, error) {
	start := time.Now()
	defer func() { r.m.ScanDuration.Observe(time.Since(start).Seconds()) }()
	var res ScanResult
	var err error
	if res.Reset, err = r.resetStuck(ctx); err != nil {
		return res, err
	}
	token := r.cfg.InstanceID + "-" + randomToken()
	rows, err := r.claim(ctx, token)
	if err != nil {
		return res, err
	}
	res.Claimed = len(rows)
	if err := r.sendAll(ctx, token, rows, &res); err != nil {
		return res, err
	}
	if res.Pruned, err = r.pruneIfDue(ctx); err != nil {
		return res, err
	}
	if res.Claimed > 0 || res.Reset > 0 {
		r.log.Debug("outbox scan", "claimed", res.Claimed, "sent", res.Sent, "retried", res.Retried,
			"parked", res.Parked, "reset", res.Reset, "took", time.Since(start))
	}
	return res, nil
}

func randomToken() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// claimedRow is a row this scan owns.
type claimedRow struct {
	id          int64
	msgID       string
	topic       string
	orderingKey string
	properties  string
	body        []byte
	retries     int
}

func (r *Relay) sendAll(ctx context.Context, token string, rows []claimedRow, res *ScanResult) error {
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sem := make(chan struct{}, r.cfg.Concurrency)
	for _, row := range rows {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			outcome, err := r.sendOne(ctx, token, row)
			mu.Lock()
			defer mu.Unlock()
			switch outcome {
			case StatusSent:
				res.Sent++
			case StatusPending:
				res.Retried++
			case StatusFailed:
				res.Parked++
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
		})
	}
	wg.Wait()
	return firstErr
}

// sendOne sends a claimed row and records the outcome; the returned error
// is the database's, a failed send being an outcome.
func (r *Relay) sendOne(ctx context.Context, token string, row claimedRow) (string, error) {
	msg := txmq.Message{Topic: row.topic, Key: row.msgID, OrderingKey: row.orderingKey, Body: row.body}
	if row.properties != "" {
		if err := json.Unmarshal([]byte(row.properties), &msg.Properties); err != nil {
			return r.failed(ctx, token, row, fmt.Errorf("%w: properties: %w", txmq.ErrInvalidArgument, err))
		}
	}
	sctx, cancel := context.WithTimeout(ctx, r.cfg.SendTimeout)
	sent, err := r.cfg.Sender.Send(sctx, msg)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			// Shutting down: the row stays SENDING and is reset after
			// SendingTimeout, by this relay or another.
			return "", nil
		}
		return r.failed(ctx, token, row, err)
	}
	now := time.Now().UnixMilli()
	q := r.cfg.Table.Dialect.Rebind(`UPDATE ` + r.cfg.Table.name() + ` SET status = ?, broker_message_id = ?, last_error = NULL,
		claimed_by = NULL, updated_at = ? WHERE id = ? AND status = ? AND claimed_by = ?`)
	if err := r.record(ctx, q, StatusSent, sent.MessageID, now, row.id, StatusSending, token); err != nil {
		// Sent but not recorded: the row is reset after SendingTimeout and
		// sent again, which the dedup key turns into its first message ID.
		return "", fmt.Errorf("outbox: mark %s sent: %w", row.msgID, err)
	}
	r.m.Sent.Inc()
	r.log.Debug("outbox row sent", "msg_key", row.msgID, "msg_id", sent.MessageID, "duplicate", sent.Duplicate)
	return StatusSent, nil
}

// failed records a failed send: PENDING again after the backoff, or FAILED
// after MaxAttempts, or at once for a message the broker will never take.
func (r *Relay) failed(ctx context.Context, token string, row claimedRow, sendErr error) (string, error) {
	r.m.SendErrors.Inc()
	tries := row.retries + 1
	status := StatusPending
	if tries >= r.cfg.MaxAttempts || errors.Is(sendErr, txmq.ErrInvalidArgument) {
		status = StatusFailed
	}
	wait := r.cfg.Backoff[min(tries, len(r.cfg.Backoff))-1]
	now := time.Now()
	text := sendErr.Error()
	if len(text) > maxErrText {
		text = text[:maxErrText]
	}
	q := r.cfg.Table.Dialect.Rebind(`UPDATE ` + r.cfg.Table.name() + ` SET status = ?, retry_count = ?, next_retry_at = ?,
		last_error = ?, claimed_by = NULL, updated_at = ? WHERE id = ? AND status = ? AND claimed_by = ?`)
	if err := r.record(ctx, q, status, tries, now.Add(wait).UnixMilli(), text, now.UnixMilli(),
		row.id, StatusSending, token); err != nil {
		return "", fmt.Errorf("outbox: record the failed send of %s: %w", row.msgID, err)
	}
	if status == StatusFailed {
		r.m.Parked.Inc()
		r.log.Error("outbox row parked as FAILED", "msg_key", row.msgID, "tries", tries, "err", sendErr)
		return status, nil
	}
	r.log.Warn("outbox send failed; retrying later", "msg_key", row.msgID, "tries", tries, "retry_in", wait, "err", sendErr)
	return status, nil
}

// record runs an outcome's conditional update, trying again a few times on
// an error: InnoDB reports deadlocks between these single-row updates and
// the claims' index locks, and the update is safe to repeat. A row whose
// outcome could not be recorded stays SENDING until SendingTimeout.
func (r *Relay) record(ctx context.Context, q string, args ...any) error {
	wait := 5 * time.Millisecond
	var err error
	for range recordTries {
		if _, err = r.cfg.DB.ExecContext(ctx, q, args...); err == nil || ctx.Err() != nil {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait *= 2
	}
	return err
}
