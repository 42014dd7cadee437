package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/client/go/outbox"
)

// The two ways the order service tells the points service.
const (
	// schemeTx: a transactional message (SendHalf, the local transaction
	// with a transaction-log row, Commit) and a check-back that reads the
	// transaction-log table.
	schemeTx = "tx"
	// schemeOutbox: an outbox row in the local transaction, sent by a
	// relay.
	schemeOutbox = "outbox"
)

const producerGroup = "orders"

// Payment is the payment provider's callback: the order is paid.
type Payment struct {
	OrderID string `json:"order_id"`
	UserID  string `json:"user_id"`
	Points  int64  `json:"points"`
}

// ordersConfig configures the order service.
type ordersConfig struct {
	Addrs   []string
	DB      *sql.DB
	Dialect txmq.Dialect
	Scheme  string
	// CheckAfter is the half messages' first check-back (tx scheme).
	CheckAfter time.Duration
	// MaxLocalTx bounds a local transaction (tx scheme).
	MaxLocalTx time.Duration
	// RetryTimeout bounds the producer's retries while the broker is away.
	RetryTimeout time.Duration
	// Relay tunes the outbox relay (outbox scheme): DB, Table and Sender
	// are filled in.
	Relay       outbox.RelayConfig
	DialOptions []grpc.DialOption
	Registerer  prometheus.Registerer
	Log         *slog.Logger
}

// Orders is the order service: it turns payment callbacks into paid orders,
// and makes sure the points service hears of each one.
type Orders struct {
	db         *sql.DB
	dialect    txmq.Dialect
	scheme     string
	checkAfter time.Duration
	log        *slog.Logger
	producer   *txmq.Producer
	txlog      *txmq.TxLog   // tx scheme
	outbox     outbox.Table  // outbox scheme
	relay      *outbox.Relay // outbox scheme
	// failLocal, when set, may fail an order's local transaction after its
	// message was sent or written: drill 5's fault.
	failLocal func(orderID string) error
}

func ordersSchema() string {
	return `CREATE TABLE IF NOT EXISTS orders (
	order_id VARCHAR(64) PRIMARY KEY,
	user_id  VARCHAR(64) NOT NULL,
	points   BIGINT      NOT NULL,
	status   VARCHAR(16) NOT NULL,
	paid_at  BIGINT      NOT NULL
)`
}

func newOrders(ctx context.Context, cfg ordersConfig) (*Orders, error) {
	if err := execAll(ctx, cfg.DB, ordersSchema()); err != nil {
		return nil, err
	}
	o := &Orders{db: cfg.DB, dialect: cfg.Dialect, scheme: cfg.Scheme, checkAfter: cfg.CheckAfter, log: cfg.Log}
	pcfg := txmq.ProducerConfig{Addrs: cfg.Addrs, ProducerGroup: producerGroup, RetryTimeout: cfg.RetryTimeout,
		DialOptions: cfg.DialOptions, Logger: cfg.Log}
	switch cfg.Scheme {
	case schemeTx:
		l, err := txmq.NewTxLog(txmq.TxLogConfig{DB: cfg.DB, Dialect: cfg.Dialect, MaxLocalTx: cfg.MaxLocalTx})
		if err != nil {
			return nil, err
		}
		if err := l.CreateTable(ctx); err != nil {
			return nil, err
		}
		o.txlog = l
		pcfg.Checker = l.Check
	case schemeOutbox:
		o.outbox = outbox.Table{Dialect: cfg.Dialect}
		if err := o.outbox.CreateTable(ctx, cfg.DB); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("scheme %q is neither %q nor %q", cfg.Scheme, schemeTx, schemeOutbox)
	}
	p, err := txmq.NewProducerContext(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	o.producer = p
	if cfg.Scheme == schemeOutbox {
		rc := cfg.Relay
		rc.DB, rc.Table, rc.Sender, rc.Logger, rc.Registerer = cfg.DB, o.outbox, p, cfg.Log, cfg.Registerer
		if o.relay, err = outbox.NewRelay(rc); err != nil {
			p.Close()
			return nil, err
		}
	}
	return o, nil
}

// Run runs the outbox relay until ctx ends (the tx scheme has nothing to
// run: the producer answers check-backs by itself).
func (o *Orders) Run(ctx context.Context) error {
	if o.relay == nil {
		<-ctx.Done()
		return nil
	}
	return o.relay.Run(ctx)
}

// Close closes the producer.
func (o *Orders) Close() error { return o.producer.Close() }

// Pay records the paid order and its event in one local transaction. It
// may be called again with the same order (the provider retries callbacks
// that failed): a paid order stays paid once, and its event is sent once.
func (o *Orders) Pay(ctx context.Context, pay Payment) error {
	ev := OrderPaid{OrderID: pay.OrderID, UserID: pay.UserID, Points: pay.Points, PaidAt: time.Now().UnixMilli(), Kind: kindCredit}
	if err := ev.check(); err != nil {
		return err
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	if o.scheme == schemeTx {
		return o.payTx(ctx, ev, body)
	}
	return o.payOutbox(ctx, ev, body)
}

// errAlreadyPaid: a repeated callback found the order paid; its new half
// message is rolled back.
var errAlreadyPaid = errors.New("the order is paid already")

func (o *Orders) payTx(ctx context.Context, ev OrderPaid, body []byte) error {
	txID := ev.OrderID + ":paid"
	err := o.executeTx(ctx, txID, ev, body)
	if errors.Is(err, txmq.ErrConflict) {
		// An earlier attempt under this ID was rolled back (its local
		// transaction failed, the order was not paid): a transaction ID
		// is never reused, so this attempt takes a new one. The order's
		// key still keeps it paid once.
		txID += ":" + strconv.FormatInt(time.Now().UnixNano(), 36)
		err = o.executeTx(ctx, txID, ev, body)
	}
	switch {
	case errors.Is(err, errAlreadyPaid):
		return nil
	case errors.Is(err, txmq.ErrCommitPending):
		// The order is paid; check-back commits its message.
		o.log.Warn("order paid, its message left to check-back", "order", ev.OrderID, "err", err)
		return nil
	}
	return err
}

func (o *Orders) executeTx(ctx context.Context, txID string, ev OrderPaid, body []byte) error {
	_, err := o.txlog.Execute(ctx, o.producer, txID, txmq.Message{Topic: topic, Body: body},
		func(ctx context.Context, tx *sql.Tx) error {
			if o.failLocal != nil {
				if err := o.failLocal(ev.OrderID); err != nil {
					return err
				}
			}
			first, err := o.insertOrder(ctx, tx, ev)
			if err == nil && !first {
				return errAlreadyPaid
			}
			return err
		}, txmq.WithCheckAfter(o.checkAfter))
	return err
}

func (o *Orders) payOutbox(ctx context.Context, ev OrderPaid, body []byte) error {
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	first, err := o.insertOrder(ctx, tx, ev)
	if err != nil || !first {
		return err
	}
	if err := o.outbox.Write(ctx, tx, outbox.Message{ID: ev.OrderID + ":paid", Topic: topic, Body: body}); err != nil {
		return err
	}
	if o.failLocal != nil {
		if err := o.failLocal(ev.OrderID); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// insertOrder writes the paid order, reporting false when it was paid
// already.
func (o *Orders) insertOrder(ctx context.Context, tx *sql.Tx, ev OrderPaid) (bool, error) {
	res, err := tx.ExecContext(ctx, o.dialect.InsertIgnore("orders", "order_id, user_id, points, status, paid_at", 5),
		ev.OrderID, ev.UserID, ev.Points, "paid", ev.PaidAt)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}
