// Command points is the order → points consumer of docs/api.md: it consumes
// "order-paid" messages and credits the user's points, each message once
// however often it is delivered, with txmq.ProcessOnce and a consumer_record
// table in the same SQLite database as the balances.
//
//	go run . --addr 127.0.0.1:7420 --db points.db
//
// and, from another terminal,
//
//	go run ./cmd/brokerctl send order-paid '{"order_id":"order-42","user_id":"alice","points":120}' --key order-42:paid
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	txmq "github.com/txmq/txmq/client/go"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:7420", "broker gRPC addresses, comma-separated")
	dbPath := flag.String("db", "points.db", "SQLite database file")
	topic := flag.String("topic", "order-paid", "topic to consume")
	group := flag.String("group", "points", "consumer group")
	concurrency := flag.Int("concurrency", 4, "handlers in parallel")
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*addr, *dbPath, *topic, *group, *concurrency, log); err != nil {
		fmt.Fprintln(os.Stderr, "points:", err)
		os.Exit(1)
	}
}

func run(addr, dbPath, topic, group string, concurrency int, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	db, err := OpenDB(ctx, dbPath)
	if err != nil {
		return err
	}
	defer db.Close()

	c, err := txmq.NewConsumer(txmq.ConsumerConfig{
		Addrs:       strings.Split(addr, ","),
		Topic:       topic,
		Group:       group,
		Concurrency: concurrency,
		Prefetch:    2 * concurrency,
		Logger:      log,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	p := &Points{db: db, log: log}
	return c.Run(ctx, p.Handle)
}
