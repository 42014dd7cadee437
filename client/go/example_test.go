package txmq_test

import (
	"context"
	"errors"
	"log"

	txmq "github.com/txmq/txmq/client/go"
)

// The local transaction writes its business change and a transaction-log
// row in one database transaction. The producer group's check-back handler
// answers the broker by looking that row up, so the outcome survives a crash
// between the local commit and the broker commit.
func ExampleProducer_SendInTransaction() {
	ctx := context.Background()
	p, err := txmq.NewProducer(txmq.ProducerConfig{
		Addrs:         []string{"127.0.0.1:7420"},
		ProducerGroup: "orders",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	txID := "order-42:paid" // the business key: unique per producer group
	msg := txmq.Message{Topic: "order-events", Key: "order-42", Body: []byte(`{"order":42,"status":"paid"}`)}

	id, err := p.SendInTransaction(ctx, txID, msg, func(ctx context.Context) error {
		// tx, err := db.BeginTx(ctx, nil)
		// if err != nil { return err }
		// defer tx.Rollback()
		// // A retry after a crash finds its own row: the work is done.
		// var done bool
		// if err := tx.QueryRowContext(ctx,
		//     `SELECT EXISTS (SELECT 1 FROM tx_log WHERE producer_group = 'orders' AND tx_id = $1)`,
		//     txID).Scan(&done); err != nil || done {
		//     return err
		// }
		// if _, err := tx.ExecContext(ctx,
		//     `UPDATE orders SET status = 'paid' WHERE id = $1`, 42); err != nil {
		//     return err
		// }
		// // The check-back handler reads this row: present means COMMIT,
		// // absent after the transaction's timeout means ROLLBACK.
		// if _, err := tx.ExecContext(ctx,
		//     `INSERT INTO tx_log (producer_group, tx_id) VALUES ('orders', $1)`, txID); err != nil {
		//     return err
		// }
		// return tx.Commit()
		return nil
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

func ExampleConsumer_Run() {
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{
		Addrs:       []string{"127.0.0.1:7420"},
		Topic:       "order-events",
		Group:       "billing",
		Concurrency: 4,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err = c.Run(ctx, func(ctx context.Context, d *txmq.Delivery) error {
		// Deliveries can repeat: record d.MessageID in the same database
		// transaction as the work and skip IDs already recorded.
		log.Printf("message %s attempt %d: %s", d.MessageID, d.Attempt, d.Body)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
}
