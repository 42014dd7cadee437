// Command points is the order → points example of docs/consistency.md: an
// order service that turns payment callbacks into paid orders, a points
// service that credits each paid order's points once, a reconciliation job
// between them, and the fault drills that measure how "eventual" the
// consistency is. It is a module of its own (for its database drivers), so
// from the repository's root it runs with go -C; each service with one
// command against a local broker (go run ./cmd/broker), SQLite by default:
//
//	go -C examples/points run . order --scheme tx      # or --scheme outbox
//	go -C examples/points run . points
//	curl -d '{"order_id":"order-42","user_id":"alice","points":120}' 127.0.0.1:8080/pay
//
//	go -C examples/points run . drill consumer-stopped # 5 min, both schemes
//	go -C examples/points run . drill all --short
//
// --dsn postgres://user:pass@host/db or --dsn 'mysql://user:pass@tcp(host:3306)/db'
// puts a service on PostgreSQL or MySQL/MariaDB instead.
package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	txmq "github.com/txmq/txmq/client/go"
)

const usage = `usage: points order|points|drill [flags]
  order   the order service: POST /pay {"order_id","user_id","points"}
  points  the points service: consumes order-paid, credits once
  drill   NAME|all: runs a fault drill against the real services
          (drills: consumer-stopped, broker-down, duplicates, ack-lost, local-tx-fails)
Run "points COMMAND -h" for a command's flags.`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "order":
		err = orderMain(ctx, os.Args[2:])
	case "points":
		err = pointsMain(ctx, os.Args[2:])
	case "drill":
		err = drillMain(ctx, os.Args[2:], os.Stdout)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "points:", err)
		os.Exit(1)
	}
}

func newLogger(verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// parseService adds -v to a service's flags, parses them and opens its
// database (*dsn, read after parsing).
func parseService(ctx context.Context, fs *flag.FlagSet, args []string, dsn *string) (*slog.Logger, *sql.DB, txmq.Dialect, error) {
	verbose := fs.Bool("v", false, "debug logs")
	_ = fs.Parse(args)
	db, dialect, err := openDB(ctx, *dsn)
	return newLogger(*verbose), db, dialect, err
}

func orderMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("order", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:7420", "broker gRPC addresses, comma-separated")
	dsn := fs.String("dsn", "orders.db", "the orders database: a SQLite file, postgres://... or mysql://...")
	scheme := fs.String("scheme", schemeTx, "tx (transactional message, check-back on the transaction-log table) or outbox (local message table and relay)")
	listen := fs.String("listen", "127.0.0.1:8080", "HTTP address of the payment callback (POST /pay) and /metrics")
	pointsDSN := fs.String("points-dsn", "", "the points database, read by the reconciliation job; empty runs no job")
	every := fs.Duration("reconcile-every", 5*time.Minute, "reconciliation interval")
	grace := fs.Duration("reconcile-grace", time.Minute, "newest part of the window reconciliation leaves alone (messages in flight)")
	checkAfter := fs.Duration("check-after", 6*time.Second, "first check-back of a half message (tx scheme)")
	log, db, dialect, err := parseService(ctx, fs, args, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	reg := prometheus.NewRegistry()
	o, err := newOrders(ctx, ordersConfig{Addrs: strings.Split(*addr, ","), DB: db, Dialect: dialect, Scheme: *scheme,
		CheckAfter: *checkAfter, Registerer: reg, Log: log})
	if err != nil {
		return err
	}
	defer o.Close()
	if *pointsDSN != "" {
		pdb, pd, err := openDB(ctx, *pointsDSN)
		if err != nil {
			return err
		}
		defer pdb.Close()
		job, err := newReconciler(reconcilerConfig{Orders: o, PointsDB: pdb, PointsDialect: pd, Interval: *every,
			Grace: *grace, Registerer: reg, Log: log})
		if err != nil {
			return err
		}
		go func() { _ = job.Run(ctx) }()
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /pay", func(w http.ResponseWriter, r *http.Request) { payHandler(w, r, o, log) })
	srv := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	go func() { _ = o.Run(ctx) }()
	log.Info("order service up", "scheme", *scheme, "dialect", dialect, "listen", *listen)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// payHandler is the payment callback. Any failure answers 503, and the
// provider sends the callback again; the order service is idempotent.
func payHandler(w http.ResponseWriter, r *http.Request, o *Orders, log *slog.Logger) {
	var p Payment
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&p); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if err := o.Pay(r.Context(), p); err != nil {
		log.Warn("payment callback failed; the provider will retry", "order", p.OrderID, "err", err)
		code := http.StatusServiceUnavailable
		if errors.Is(err, errBadEvent) {
			code = http.StatusBadRequest
		}
		http.Error(w, err.Error(), code)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"order_id":%q,"status":"paid"}`+"\n", p.OrderID)
}

func pointsMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("points", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:7420", "broker gRPC addresses, comma-separated")
	dsn := fs.String("dsn", "points.db", "the points database: a SQLite file, postgres://... or mysql://...")
	concurrency := fs.Int("concurrency", 4, "handlers in parallel")
	log, db, dialect, err := parseService(ctx, fs, args, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	p, err := newPoints(ctx, db, dialect, log)
	if err != nil {
		return err
	}
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: strings.Split(*addr, ","), Topic: topic, Group: pointsGroup,
		Concurrency: *concurrency, Prefetch: 2 * *concurrency, Logger: log})
	if err != nil {
		return err
	}
	defer c.Close()
	log.Info("points service up", "dialect", dialect)
	return c.Run(ctx, p.Handle)
}
