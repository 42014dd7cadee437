package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/client/go/outbox"
	"github.com/txmq/txmq/client/go/reconcile"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/raftlog"
)

const pointsGroup = "points"

// localBroker is a single-node broker in this process, on loopback, that a
// drill can stop and start again on the same addresses and data.
type localBroker struct {
	dir, grpcAddr, raftAddr string
	log                     *slog.Logger
	mu                      sync.Mutex
	b                       *broker.Broker
}

func startLocalBroker(dir string, log *slog.Logger) (*localBroker, error) {
	lb := &localBroker{dir: dir, grpcAddr: "127.0.0.1:0", raftAddr: "127.0.0.1:0", log: log}
	return lb, lb.start()
}

// start opens the broker on listeners of its own: on new ports the first
// time (the system picks them, so nothing else can take them between the
// pick and the listen), on the same ports after a stop.
func (lb *localBroker) start() error {
	gl, err := loopback.ListenAgain(lb.grpcAddr, 10*time.Second)
	if err != nil {
		return fmt.Errorf("start the broker: %w", err)
	}
	rl, err := loopback.ListenAgain(lb.raftAddr, 10*time.Second)
	if err != nil {
		gl.Close()
		return fmt.Errorf("start the broker: %w", err)
	}
	lb.grpcAddr, lb.raftAddr = gl.Addr().String(), rl.Addr().String()
	b, err := broker.Open(broker.Config{
		Raft: raftlog.Config{
			NodeID: "drill", Dir: lb.dir, Listener: rl, Bootstrap: true,
			HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
			LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		},
		GRPCListener: gl,
		Logger:       lb.log,
		// Producers find a restarted broker within a second.
		CheckBack: checkback.Config{HeartbeatInterval: 200 * time.Millisecond, Lease: 2 * time.Second},
	})
	if err != nil {
		gl.Close()
		rl.Close()
		return fmt.Errorf("start the broker: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		b.Close()
		return fmt.Errorf("start the broker: %w", err)
	}
	lb.mu.Lock()
	lb.b = b
	lb.mu.Unlock()
	return nil
}

func (lb *localBroker) stop() {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.b != nil {
		lb.b.Close()
		lb.b = nil
	}
}

// drillEnv is one drill's world: a broker, the two databases, the order
// service (with its relay or check-back, and the reconciliation job), the
// points service, and the counters the drill reads.
type drillEnv struct {
	cfg      drillConfig
	log      *slog.Logger
	broker   *localBroker // nil with an external broker
	addr     string
	conn     *grpc.ClientConn
	admin    txmqv1.AdminServiceClient
	ordersDB *sql.DB
	ordersD  txmq.Dialect
	pointsDB *sql.DB
	pointsD  txmq.Dialect
	orders   *Orders
	points   *Points
	rec      *reconcile.Job

	consumer *consumerRun
	bg       sync.WaitGroup
	cancel   context.CancelFunc

	// Fault switches and what the points service saw.
	dropAcks    atomic.Bool
	acksDropped atomic.Int64
	mu          sync.Mutex
	crash       map[string]uint32 // order ID → nack deliveries below this attempt
	deliveries  map[string]uint32 // order ID → highest attempt seen (crashed orders)
	applies     map[string]int    // message ID → times ProcessOnce applied it
	blocked     int               // applies the ledger key turned into no change
	redelivered int               // deliveries with Attempt > 1
	failed      map[string]bool   // orders whose local transaction failed: must get nothing
	ghosts      int               // credits for failed orders
	actions     int               // reconciliation's compensations and reversals
}

func newDrillEnv(ctx context.Context, cfg drillConfig) (*drillEnv, error) {
	e := &drillEnv{cfg: cfg, log: cfg.Log, crash: map[string]uint32{}, deliveries: map[string]uint32{},
		applies: map[string]int{}, failed: map[string]bool{}, addr: cfg.Addr}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	if e.addr == "" {
		b, err := startLocalBroker(filepath.Join(cfg.Dir, "broker"), cfg.Log)
		if err != nil {
			return nil, err
		}
		e.broker, e.addr = b, b.grpcAddr
	}
	var err error
	if e.conn, err = grpc.NewClient(e.addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		return nil, err
	}
	e.admin = txmqv1.NewAdminServiceClient(e.conn)
	if err := e.openDatabases(ctx); err != nil {
		return nil, err
	}
	if err := e.startServices(ctx); err != nil {
		return nil, err
	}
	if err := e.emptyTables(ctx); err != nil {
		return nil, err
	}
	ok = true
	return e, nil
}

func (e *drillEnv) openDatabases(ctx context.Context) error {
	ordersDSN, pointsDSN := e.cfg.OrdersDSN, e.cfg.PointsDSN
	if ordersDSN == "" {
		ordersDSN = filepath.Join(e.cfg.Dir, "orders.db")
	}
	if pointsDSN == "" {
		pointsDSN = filepath.Join(e.cfg.Dir, "points.db")
	}
	var err error
	if e.ordersDB, e.ordersD, err = openDB(ctx, ordersDSN); err != nil {
		return err
	}
	e.pointsDB, e.pointsD, err = openDB(ctx, pointsDSN)
	return err
}

func (e *drillEnv) startServices(ctx context.Context) error {
	_, err := e.admin.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{
		ProducerGroup: producerGroup, CheckBackoff: durationpb.New(time.Second), MaxCheckBackoff: durationpb.New(2 * time.Second),
	}})
	if err != nil {
		return fmt.Errorf("producer group config: %w", err)
	}
	e.orders, err = newOrders(ctx, ordersConfig{
		Addrs: []string{e.addr}, DB: e.ordersDB, Dialect: e.ordersD, Scheme: e.cfg.Scheme,
		CheckAfter: time.Second, MaxLocalTx: 3 * time.Second, RetryTimeout: 300 * time.Millisecond,
		Relay: outbox.RelayConfig{PollInterval: 20 * time.Millisecond, Backoff: drillBackoff, MaxAttempts: 1000, BatchSize: 200},
		Log:   e.log,
	})
	if err != nil {
		return err
	}
	e.orders.failLocal = e.failLocal
	if e.points, err = newPoints(ctx, e.pointsDB, e.pointsD, e.log); err != nil {
		return err
	}
	e.points.onApply = e.onApply
	e.rec, err = newReconciler(reconcilerConfig{Orders: e.orders, PointsDB: e.pointsDB, PointsDialect: e.pointsD,
		Interval: e.cfg.ReconcileEvery, Grace: e.cfg.ReconcileGrace, Log: e.log})
	if err != nil {
		return err
	}
	bctx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.bg.Go(func() { _ = e.orders.Run(bctx) })
	e.bg.Go(func() { _ = e.rec.Run(bctx) })
	if err := e.startConsumer(); err != nil {
		return err
	}
	return e.configureGroup(ctx)
}

// emptyTables deletes what an earlier drill left in databases given by
// DSN: a drill counts every order and ledger row it finds. The services
// are up, so the tables exist, and no order has been paid yet.
func (e *drillEnv) emptyTables(ctx context.Context) error {
	tables := map[*sql.DB][]string{
		e.ordersDB: {"orders", "txmq_tx_log", "txmq_outbox"},
		e.pointsDB: {"points_ledger", "points_balance", "consumer_record"},
	}
	for db, names := range tables {
		for _, n := range names {
			if n == "txmq_tx_log" && e.cfg.Scheme != schemeTx || n == "txmq_outbox" && e.cfg.Scheme != schemeOutbox {
				continue
			}
			if _, err := db.ExecContext(ctx, `DELETE FROM `+n); err != nil {
				return fmt.Errorf("empty %s: %w", n, err)
			}
		}
	}
	return nil
}

// drillBackoff is the relay's backoff in the drills, shorter than the
// production default (10 s to 10 min) so that a drill ends in seconds.
var drillBackoff = []time.Duration{200 * time.Millisecond, 500 * time.Millisecond, time.Second}

// configureGroup waits for the consumer group and makes it redeliver soon:
// a short ack deadline (drill 4), no nack backoff and room for 50
// deliveries of one message (drill 3).
func (e *drillEnv) configureGroup(ctx context.Context) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := e.admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: pointsGroup})
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the consumer group did not appear: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	maxDeliveries := uint32(100)
	_, err := e.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: pointsGroup, MaxDeliveries: &maxDeliveries, AckDeadline: durationpb.New(2 * time.Second),
		RedeliveryBackoff: []*durationpb.Duration{durationpb.New(0)},
	}})
	return err
}

// consumerRun is the points service's consumer, which drill 1 stops and
// starts.
type consumerRun struct {
	c      *txmq.Consumer
	cancel context.CancelFunc
	done   chan error
}

func (e *drillEnv) startConsumer() error {
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{
		Addrs: []string{e.addr}, Topic: topic, Group: pointsGroup, Concurrency: 4, Prefetch: 16, Logger: e.log,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithStreamInterceptor(e.ackInterceptor)},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	run := &consumerRun{c: c, cancel: cancel, done: make(chan error, 1)}
	go func() { run.done <- c.Run(ctx, e.handle) }()
	e.consumer = run
	return nil
}

func (e *drillEnv) stopConsumer() {
	if e.consumer == nil {
		return
	}
	e.consumer.cancel()
	<-e.consumer.done
	e.consumer.c.Close()
	e.consumer = nil
}

var errCrash = errors.New("drill: crashed after the database commit, before the ack")

// handle is the points service's handler, with drill 3's fault: an order
// marked to crash is applied, then nacked, until its attempt reaches the
// mark.
func (e *drillEnv) handle(ctx context.Context, d *txmq.Delivery) error {
	if err := e.points.Handle(ctx, d); err != nil {
		return err
	}
	ev, _ := decodeEvent(d.Body)
	e.mu.Lock()
	if d.Attempt > 1 {
		e.redelivered++
	}
	until, crash := e.crash[ev.OrderID]
	if crash {
		e.deliveries[ev.OrderID] = max(e.deliveries[ev.OrderID], d.Attempt)
	}
	e.mu.Unlock()
	if crash && d.Attempt < until {
		return txmq.RetryAfter(errCrash, 0)
	}
	return nil
}

func (e *drillEnv) onApply(d *txmq.Delivery, ev OrderPaid, changed bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.applies[d.MessageID]++
	if !changed {
		e.blocked++
	}
	if changed && ev.Kind != kindReverse && e.failed[ev.OrderID] {
		e.ghosts++
	}
	if ev.Kind == kindCompensate || ev.Kind == kindReverse {
		e.actions++
	}
}

// ackInterceptor drops the consumer's acks while drill 4's fault is on: the
// handler succeeded, the broker never hears of it.
func (e *drillEnv) ackInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	cs, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, err
	}
	return &ackDropper{ClientStream: cs, e: e}, nil
}

type ackDropper struct {
	grpc.ClientStream
	e *drillEnv
}

func (a *ackDropper) SendMsg(m any) error {
	if req, ok := m.(*txmqv1.SubscribeRequest); ok && req.GetAck() != nil && a.e.dropAcks.Load() {
		a.e.acksDropped.Add(int64(len(req.GetAck().GetMessageIds())))
		return nil
	}
	return a.ClientStream.SendMsg(m)
}

// failLocal is drill 5's fault, off unless the load marked the order.
func (e *drillEnv) failLocal(orderID string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failed[orderID] {
		return errPaymentRejected
	}
	return nil
}

var errPaymentRejected = errors.New("drill: the local transaction failed (payment verification rejected)")

func (e *drillEnv) close() {
	e.stopConsumer()
	if e.cancel != nil {
		e.cancel()
	}
	e.bg.Wait()
	if e.orders != nil && e.orders.producer != nil {
		e.orders.Close()
	}
	for _, db := range []*sql.DB{e.ordersDB, e.pointsDB} {
		if db != nil {
			db.Close()
		}
	}
	if e.conn != nil {
		e.conn.Close()
	}
	if e.broker != nil {
		e.broker.stop()
	}
	if e.cfg.removeDir {
		os.RemoveAll(e.cfg.Dir)
	}
}
