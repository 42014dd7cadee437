package txmq_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"net/http"
	"time"

	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
)

// The transaction-log table both examples use lives in the business
// database, next to the tables the local transaction changes:
//
//	CREATE TABLE tx_log (
//		tx_id  TEXT PRIMARY KEY, -- the transaction ID of the half message
//		status TEXT NOT NULL     -- 'committed' or 'rolled_back'
//	);
//
// The examples use database/sql with PostgreSQL placeholders; they are
// compiled, not run, and open no database.

// The longest a local transaction may run: it runs under a context with this
// timeout, so the database aborts it once the time is up.
const maxLocalTx = 30 * time.Second

// When a half message without a tx_log row is surely abandoned: well past
// maxLocalTx, with a margin for clock skew between the broker, which stamps
// CreatedAt, and this host.
const rollbackAfter = time.Minute

// The checker reads the transaction-log table on the primary database, the
// one the local transaction wrote: a row means the local transaction
// committed. It never reads a cache or a flag set outside that transaction.
func ExampleChecker() {
	var db *sql.DB // sql.Open(driver, dsn): the primary, never a read replica

	checker := func(ctx context.Context, m txmq.HalfMessage) (txmq.Resolution, error) {
		var status string
		err := db.QueryRowContext(ctx, `SELECT status FROM tx_log WHERE tx_id = $1`, m.TransactionID).Scan(&status)
		if errors.Is(err, sql.ErrNoRows) {
			if time.Since(m.CreatedAt) < rollbackAfter {
				// The local transaction may still be running and commit.
				return txmq.Unknown, nil
			}
			// Abandoned. Record the rollback before answering it: should
			// the local transaction still be running against all odds, its
			// own INSERT into tx_log now fails on the primary key, so it can
			// never commit after the message was rolled back. If it won the
			// race instead, its row is what we read back.
			if _, err := db.ExecContext(ctx,
				`INSERT INTO tx_log (tx_id, status) VALUES ($1, 'rolled_back') ON CONFLICT (tx_id) DO NOTHING`,
				m.TransactionID); err != nil {
				return txmq.Unknown, err
			}
			err = db.QueryRowContext(ctx, `SELECT status FROM tx_log WHERE tx_id = $1`, m.TransactionID).Scan(&status)
		}
		switch {
		case err != nil:
			// Counts like Unknown: the broker asks again later.
			return txmq.Unknown, err
		case status == "committed":
			return txmq.Commit, nil
		default:
			return txmq.Rollback, nil
		}
	}

	p, err := txmq.NewProducer(txmq.ProducerConfig{
		Addrs:             []string{"broker-1:7420", "broker-2:7420", "broker-3:7420"},
		ProducerGroup:     "orders",
		Checker:           checker,
		CallbackListen:    ":7430",
		CallbackAdvertise: "orders-1.internal:7430", // the address the brokers dial
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()
	log.Printf("answering check-backs at %s as %s", p.CallbackAddr(), p.InstanceID())
}

// The local transaction writes its business change and its tx_log row in one
// database transaction, so the row exists exactly when the change committed.
// The producer group's Checker (see ExampleChecker) answers the broker from
// that row, so the outcome survives a crash between the local commit and the
// broker commit.
func ExampleProducer_SendInTransaction() {
	ctx := context.Background()
	var db *sql.DB // sql.Open(driver, dsn)
	p, err := txmq.NewProducer(txmq.ProducerConfig{
		Addrs:         []string{"127.0.0.1:7420"},
		ProducerGroup: "orders",
		// Checker: the one of ExampleChecker. Every producer of a group
		// that sends half messages should have one.
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	txID := "order-42:paid" // the business key: unique per producer group
	msg := txmq.Message{Topic: "order-events", Key: "order-42", Body: []byte(`{"order":42,"status":"paid"}`)}

	id, err := p.SendInTransaction(ctx, txID, msg, func(ctx context.Context) error {
		// The checker answers Rollback only once a transaction this old
		// must have ended.
		ctx, cancel := context.WithTimeout(ctx, maxLocalTx)
		defer cancel()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		// A retry after a crash finds its own row: the work is done. A row
		// the checker wrote means the message was given up on.
		var status string
		switch err := tx.QueryRowContext(ctx, `SELECT status FROM tx_log WHERE tx_id = $1`, txID).Scan(&status); {
		case err == nil && status == "committed":
			return nil
		case err == nil:
			return fmt.Errorf("transaction %s was rolled back by check-back", txID)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
		if _, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, 42); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO tx_log (tx_id, status) VALUES ($1, 'committed')`, txID); err != nil {
			return err
		}
		return tx.Commit()
	})
	switch {
	case errors.Is(err, txmq.ErrCommitPending):
		// The order is paid; the broker commits the message through
		// check-back, so delivery will follow.
		log.Printf("message %s: commit pending: %v", id, err)
	case err != nil:
		log.Printf("order not paid: %v", err)
	default:
		log.Printf("order paid, message %s committed", id)
	}
}

// A producer behind a plain web server answers check-backs over HTTP: it
// serves CheckHandler and registers its URL instead of starting a gRPC
// check-back server.
func ExampleCheckHandler() {
	// The Checker of ExampleChecker. This stand-in answers Unknown, which is
	// always safe: the broker asks again later.
	checker := func(ctx context.Context, m txmq.HalfMessage) (txmq.Resolution, error) {
		return txmq.Unknown, nil
	}

	p, err := txmq.NewProducer(txmq.ProducerConfig{
		Addrs:         []string{"broker-1:7420"},
		ProducerGroup: "orders",
		Checker:       checker,
		CallbackURL:   "http://orders-1.internal:8080/txmq/check",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	mux := http.NewServeMux()
	mux.Handle("/txmq/check", txmq.CheckHandler(checker))
	log.Fatal(http.ListenAndServe(":8080", mux))
}

func ExampleConsumer_Run() {
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{
		Addrs:       []string{"127.0.0.1:7420"},
		Topic:       "order-events",
		Group:       "billing",
		Concurrency: 4,
		Prefetch:    8,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = c.Run(ctx, func(ctx context.Context, d *txmq.Delivery) error {
		log.Printf("message %s attempt %d: %s", d.MessageID, d.Attempt, d.Body)
		if d.Attempt > 1 {
			log.Printf("the previous attempt failed: %s", d.LastError)
		}
		if err := bill(ctx, d.Body); errors.Is(err, errRateLimited) {
			return txmq.RetryAfter(err, 10*time.Second) // nack, redeliver in 10 s
		} else if err != nil {
			return err // nack, redeliver after the group's backoff
		}
		return nil // ack
	})
	if err != nil {
		log.Fatal(err)
	}
}

var errRateLimited = errors.New("billing provider: rate limited")

func bill(context.Context, []byte) error { return nil }

// The consumer_record table lives in the business database:
//
//	CREATE TABLE consumer_record (
//		consumer_group VARCHAR(127) NOT NULL,
//		message_id     VARCHAR(64)  NOT NULL,
//		processed_at   TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
//		PRIMARY KEY (consumer_group, message_id)
//	);
//
// ProcessOnce records the delivery there and applies it in one database
// transaction, so a redelivered message changes nothing.
func ExampleProcessOnce() {
	var db *sql.DB // sql.Open(driver, dsn)
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Topic: "order-paid", Group: "points"})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.Run(context.Background(), func(ctx context.Context, d *txmq.Delivery) error {
		applied, err := txmq.ProcessOnce(ctx, db, d, func(ctx context.Context, tx *sql.Tx) error {
			// Every write goes through tx.
			_, err := tx.ExecContext(ctx, `UPDATE points SET balance = balance + 100 WHERE user_id = $1`, d.Key)
			return err
		})
		if err == nil && !applied {
			log.Printf("message %s was applied before; acking it again", d.MessageID)
		}
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// A Conn calls the broker's services directly, as an admin tool does: here
// the topics, from the leader wherever it is, and a snapshot of one node.
func ExampleDial() {
	conn, err := txmq.Dial(txmq.ConnConfig{
		Addrs:        []string{"broker-1:7420", "broker-2:7420", "broker-3:7420"},
		RetryTimeout: 30 * time.Second, // rides out an election
	})
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()

	var topics *txmqv1.ListTopicsResponse
	// A read is safe to repeat: idempotent.
	err = conn.Invoke(ctx, true, func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		topics, err = txmqv1.NewAdminServiceClient(cc).ListTopics(ctx, &txmqv1.ListTopicsRequest{}, opts...)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, tp := range topics.GetTopics() {
		fmt.Println(tp.GetName(), tp.GetMessages())
	}

	// A snapshot is per node: it goes to broker-2 and nowhere else.
	err = conn.InvokeOn(ctx, "broker-2:7420", func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		_, err := txmqv1.NewAdminServiceClient(cc).TakeSnapshot(ctx, &txmqv1.TakeSnapshotRequest{}, opts...)
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
}

// TxLog does what ExampleChecker and ExampleProducer_SendInTransaction do by
// hand: the log row in the business transaction, and a Checker that reads
// only that table.
func ExampleTxLog() {
	var db *sql.DB // sql.Open("pgx", dsn)
	txlog, err := txmq.NewTxLog(txmq.TxLogConfig{DB: db, Dialect: txmq.Postgres, MaxLocalTx: maxLocalTx})
	if err != nil {
		log.Fatal(err)
	}
	if err := txlog.CreateTable(context.Background()); err != nil {
		log.Fatal(err)
	}
	p, err := txmq.NewProducer(txmq.ProducerConfig{ProducerGroup: "orders", Checker: txlog.Check})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	msg := txmq.Message{Topic: "order-paid", Body: []byte(`{"order_id":"order-42","points":120}`)}
	_, err = txlog.Execute(context.Background(), p, "order-42:paid", msg, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, "order-42")
		return err
	})
	switch {
	case err == nil, errors.Is(err, txmq.ErrCommitPending):
		// Paid; check-back delivers the message if Commit did not reach
		// the broker.
	case errors.Is(err, txmq.ErrOutcomeUnknown):
		// The database's COMMIT failed on the way back: the order may be
		// paid or not. Check-back will tell the broker which; the caller
		// may retry with the same transaction ID, which finds the row if
		// the commit happened.
	default:
		log.Fatal(err)
	}
}
