package main

import (
	"context"
	"database/sql"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/raftlog"
)

const orderPaid = `{"order_id":"order-42","user_id":"alice","points":120}`

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTestDB(t *testing.T) *sql.DB {
	t.Helper()
	db, err := OpenDB(t.Context(), filepath.Join(t.TempDir(), "points.db"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

// The same message handled 50 times credits its points once.
func TestHandleCreditsOnce(t *testing.T) {
	db := openTestDB(t)
	p := &Points{db: db, log: quiet}
	d := &txmq.Delivery{MessageID: "000001a22ac7be7a48d582fa1bd1af94", Topic: "order-paid", Group: "points", Body: []byte(orderPaid)}
	for attempt := range uint32(50) {
		d.Attempt = attempt + 1
		require.NoError(t, p.Handle(t.Context(), d))
	}
	balance, err := Balance(t.Context(), db, "alice")
	require.NoError(t, err)
	require.Equal(t, int64(120), balance)
	require.Equal(t, 1, count(t, db, "points_ledger"))
	require.Equal(t, 1, count(t, db, "consumer_record"))

	// Another group sharing the database applies the message once too.
	other := *d
	other.Group = "points-audit"
	require.NoError(t, p.Handle(t.Context(), &other))
	balance, err = Balance(t.Context(), db, "alice")
	require.NoError(t, err)
	require.Equal(t, int64(240), balance)
}

// Deliveries of the same message handled at once still credit once.
func TestHandleCreditsOnceConcurrently(t *testing.T) {
	db := openTestDB(t)
	p := &Points{db: db, log: quiet}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			d := &txmq.Delivery{MessageID: "000001a22ac7be7a48d582fa1bd1af94", Group: "points", Attempt: 1, Body: []byte(orderPaid)}
			require.NoError(t, p.Handle(t.Context(), d))
		})
	}
	wg.Wait()
	balance, err := Balance(t.Context(), db, "alice")
	require.NoError(t, err)
	require.Equal(t, int64(120), balance)
	require.Equal(t, 1, count(t, db, "points_ledger"))
}

// A message whose handling fails leaves no trace, so its redelivery applies
// it.
func TestHandleRejectsBadEvents(t *testing.T) {
	db := openTestDB(t)
	p := &Points{db: db, log: quiet}
	err := p.Handle(t.Context(), &txmq.Delivery{MessageID: "m", Group: "points", Body: []byte(`{"order_id":"order-42"}`)})
	require.ErrorIs(t, err, errBadEvent)
	require.Error(t, p.Handle(t.Context(), &txmq.Delivery{MessageID: "m", Group: "points", Body: []byte(`not json`)}))
	require.Zero(t, count(t, db, "consumer_record"))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// startBroker runs a single-node broker on loopback until the test ends.
func startBroker(t *testing.T) string {
	t.Helper()
	addr := freeAddr(t)
	b, err := broker.Open(broker.Config{
		Raft: raftlog.Config{
			NodeID: "n1", Dir: t.TempDir(), RaftAddr: freeAddr(t), Bootstrap: true,
			HeartbeatTimeout: 50 * time.Millisecond, ElectionTimeout: 50 * time.Millisecond,
			LeaderLeaseTimeout: 50 * time.Millisecond, CommitTimeout: 5 * time.Millisecond,
		},
		GRPCAddr: addr,
		Logger:   quiet,
	})
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, b.WaitReady(ctx))
	return addr
}

// waitFor polls cond until it holds, failing the test after total.
func waitFor(t *testing.T, what string, total time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(total)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", total, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// errCrash stands for a consumer that died after its database commit and
// before its ack: the broker delivers the message again.
var errCrash = errors.New("crashed after commit, before the ack")

// The same message, delivered 50 times by a real broker because the first
// 49 deliveries "crash" after their database commit, credits its points
// once, and the 50th delivery is acked.
func TestPointsOnceOnRealBroker(t *testing.T) {
	const deliveries = 50
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	addr := startBroker(t)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	admin := txmqv1.NewAdminServiceClient(conn)
	_, err = admin.CreateTopic(ctx, &txmqv1.CreateTopicRequest{Name: "order-paid"})
	require.NoError(t, err)

	db := openTestDB(t)
	p := &Points{db: db, log: quiet}
	var (
		mu         sync.Mutex
		attempts   []uint32
		lastErrors []string
	)
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{addr}, Topic: "order-paid", Group: "points", Logger: quiet})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(ctx context.Context, d *txmq.Delivery) error {
			mu.Lock()
			attempts = append(attempts, d.Attempt)
			lastErrors = append(lastErrors, d.LastError)
			mu.Unlock()
			if err := p.Handle(ctx, d); err != nil {
				return err
			}
			if d.Attempt < deliveries {
				return txmq.RetryAfter(errCrash, 0)
			}
			return nil
		})
	}()
	defer func() {
		cancel()
		require.NoError(t, <-done)
		c.Close()
	}()

	// The group exists once the consumer subscribed; let it deliver a
	// message up to 100 times before dead-lettering it.
	waitFor(t, "the consumer group", 10*time.Second, func() bool {
		_, err := admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"})
		return err == nil
	})
	maxDeliveries := uint32(100)
	cfg, err := admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
		ConsumerGroup: "points", MaxDeliveries: &maxDeliveries,
	}})
	require.NoError(t, err)
	require.Equal(t, maxDeliveries, cfg.GetConfig().GetMaxDeliveries())

	prod, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{addr}, Logger: quiet})
	require.NoError(t, err)
	defer prod.Close()
	sent, err := prod.Send(ctx, txmq.Message{Topic: "order-paid", Key: "order-42:paid", Body: []byte(orderPaid)})
	require.NoError(t, err)

	waitFor(t, "the 50th delivery to be acked", time.Minute, func() bool {
		g, err := admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"})
		if err != nil || len(g.GetTopics()) != 1 {
			return false
		}
		return g.GetTopics()[0].GetAckedThrough() >= sent.Sequence
	})

	balance, err := Balance(ctx, db, "alice")
	require.NoError(t, err)
	require.Equal(t, int64(120), balance, "credited once")
	require.Equal(t, 1, count(t, db, "points_ledger"))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, attempts, deliveries)
	for i, a := range attempts {
		require.Equal(t, uint32(i+1), a, "delivery %d", i+1)
		if i == 0 {
			require.Empty(t, lastErrors[i])
		} else {
			require.Equal(t, errCrash.Error(), lastErrors[i], "delivery %d", i+1)
		}
	}
}
