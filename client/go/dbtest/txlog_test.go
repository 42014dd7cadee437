package dbtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

const maxLocalTx = time.Second

func newTxLog(t *testing.T, d *testDB, db *sql.DB) *txmq.TxLog {
	t.Helper()
	l, err := txmq.NewTxLog(txmq.TxLogConfig{DB: db, Dialect: d.dialect, MaxLocalTx: maxLocalTx})
	require.NoError(t, err)
	require.NoError(t, l.CreateTable(t.Context()))
	exec(t, db, `CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL)`)
	return l
}

func payOrder(id string) func(ctx context.Context, tx *sql.Tx) error {
	return func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, status) VALUES ('`+id+`', 'paid')`)
		return err
	}
}

func txStatus(t *testing.T, d *testDB, db *sql.DB, txID string) string {
	t.Helper()
	var st string
	err := db.QueryRowContext(t.Context(), d.dialect.Rebind(`SELECT status FROM txmq_tx_log WHERE tx_id = ?`), txID).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return ""
	}
	require.NoError(t, err)
	return st
}

func orderCount(t *testing.T, d *testDB, db *sql.DB, id string) int64 {
	return queryInt(t, db, d.dialect, `SELECT COUNT(*) FROM orders WHERE id = ?`, id)
}

func bodies(got *deliveries) []string {
	var out []string
	for _, m := range got.all() {
		out = append(out, string(m.Body))
	}
	slices.Sort(out)
	return out
}

// sendMarker commits one more message through log and waits until the
// consumer has it: every message committed before it has been delivered
// by then, so what is missing was never delivered.
func sendMarker(t *testing.T, log *txmq.TxLog, p *txmq.Producer, topic string, got *deliveries) {
	t.Helper()
	_, err := log.Execute(t.Context(), p, "marker", txmq.Message{Topic: topic, Body: []byte("marker")}, payOrder("marker"))
	require.NoError(t, err)
	txmqtest.CheckFor(t, 15*time.Second, 20*time.Millisecond, waiting("the marker", func() bool { return slices.Contains(bodies(got), "marker") }))
}

// A business error rolls the database transaction and the half message
// back, and the message is never delivered; a retry of a committed
// transaction does not run the business function again.
func TestTxLogBusinessErrorRollsBack(t *testing.T) {
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		log := newTxLog(t, d, db)
		topic := "orders-" + d.name
		p := rb.producer(t, txmq.ProducerConfig{ProducerGroup: "shop-" + d.name, Checker: log.Check})
		got := rb.consume(t, topic, "points")

		okID, err := log.Execute(t.Context(), p, "order-1:paid", txmq.Message{Topic: topic, Body: []byte("order-1")}, payOrder("order-1"))
		require.NoError(t, err)
		require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, rb.halfState(okID))
		require.Equal(t, txmq.TxCommitted, txStatus(t, d, db, "order-1:paid"))

		noStock := errors.New("out of stock")
		badID, err := log.Execute(t.Context(), p, "order-2:paid", txmq.Message{Topic: topic, Body: []byte("order-2")},
			func(ctx context.Context, tx *sql.Tx) error {
				require.NoError(t, payOrder("order-2")(ctx, tx))
				return noStock
			})
		require.ErrorIs(t, err, noStock)
		require.Equal(t, txmqv1.HalfState_HALF_STATE_ROLLED_BACK, rb.halfState(badID))
		require.Empty(t, txStatus(t, d, db, "order-2:paid"), "no transaction-log row")
		require.Zero(t, orderCount(t, d, db, "order-2"), "the business change rolled back with it")

		again, err := log.Execute(t.Context(), p, "order-1:paid", txmq.Message{Topic: topic, Body: []byte("order-1")},
			func(context.Context, *sql.Tx) error {
				t.Error("the business function ran again for a committed transaction")
				return nil
			})
		require.NoError(t, err)
		require.Equal(t, okID, again)

		sendMarker(t, log, p, topic, got)
		require.Equal(t, []string{"marker", "order-1"}, bodies(got), "order-2 never delivered, order-1 once")
		require.Equal(t, int64(1), orderCount(t, d, db, "order-1"))
	})
}

// failCommits makes a producer's Commit never reach the broker, as if the
// process died right after its database commit. The producer is kept to
// unary calls (its session refused as unimplemented), so that the commit
// is one call to fail.
func failCommits() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if method == txmqv1.ProducerService_EndTransaction_FullMethodName {
				return status.Error(codes.Unavailable, "producer killed before Commit")
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			if method == txmqv1.ProducerService_Session_FullMethodName {
				return nil, status.Error(codes.Unimplemented, "no sessions for this producer")
			}
			return streamer(ctx, desc, cc, method, opts...)
		}),
	}
}

// A producer killed after its database commit, before the broker's
// Commit: the half message stays pending until a live instance of the
// group answers the check-back from the table, and it is delivered.
func TestTxLogKilledProducerCheckBackCommits(t *testing.T) {
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		log := newTxLog(t, d, db)
		topic := "orders-" + d.name
		group := "shop-" + d.name
		got := rb.consume(t, topic, "points")

		killed := rb.producer(t, txmq.ProducerConfig{ProducerGroup: group, RetryTimeout: 300 * time.Millisecond,
			DialOptions: append(failCommits(), grpcInsecure())})
		id, err := log.Execute(t.Context(), killed, "order-7:paid", txmq.Message{Topic: topic, Body: []byte("order-7")},
			payOrder("order-7"), txmq.WithCheckAfter(time.Second))
		require.ErrorIs(t, err, txmq.ErrCommitPending)
		require.NoError(t, killed.Close())
		require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, rb.halfState(id))
		require.Equal(t, txmq.TxCommitted, txStatus(t, d, db, "order-7:paid"))

		start := time.Now()
		rb.producer(t, txmq.ProducerConfig{ProducerGroup: group, Checker: log.Check})
		txmqtest.CheckFor(t, 20*time.Second, 20*time.Millisecond, waiting("the check-back to commit order-7", func() bool {
			return rb.halfState(id) == txmqv1.HalfState_HALF_STATE_COMMITTED
		}))
		txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, waiting("order-7's delivery", func() bool { return len(got.all()) == 1 }))
		t.Logf("%s: committed by check-back and delivered %v after the live instance started", d.name, time.Since(start).Round(time.Millisecond))
		require.Equal(t, []string{"order-7"}, bodies(got))
	})
}

// The database COMMIT fails with its outcome unknown (the connection is cut
// at the COMMIT, before or after the server commits): the half message is
// left pending, and check-back resolves it to what the database holds.
func TestTxLogCommitOutcomeUnknown(t *testing.T) {
	rb := newRealBroker(t)
	forEachDB(t, func(t *testing.T, d *testDB) {
		direct := d.open(t)
		checker := newTxLog(t, d, direct)
		// The local transactions go through the cut: a proxy in front of
		// the server, or for SQLite a driver that fails the COMMIT.
		var arm func(cutMode)
		var viaCut *sql.DB
		if d.dialect == txmq.SQLite {
			d.driver = "sqlite-cut"
			viaCut = d.open(t)
			arm = armSQLiteCut
		} else {
			wire := postgresCommit
			if d.dialect == txmq.MySQL {
				wire = mysqlCommit
			}
			proxy := newCommitProxy(t, d.server, wire)
			viaCut = d.openDSN(t, d.connect(proxy.addr()))
			arm = proxy.arm
			t.Cleanup(func() { require.Equal(t, 2, proxy.cutCount(), "one cut per direction") })
		}
		local, err := txmq.NewTxLog(txmq.TxLogConfig{DB: viaCut, Dialect: d.dialect, MaxLocalTx: maxLocalTx})
		require.NoError(t, err)

		topic := "orders-" + d.name
		p := rb.producer(t, txmq.ProducerConfig{ProducerGroup: "shop-" + d.name, Checker: checker.Check})
		got := rb.consume(t, topic, "points")

		for _, c := range []struct {
			mode   cutMode
			order  string
			status string
			final  txmqv1.HalfState
		}{
			{cutAfterCommit, "order-c", txmq.TxCommitted, txmqv1.HalfState_HALF_STATE_COMMITTED},
			{cutBeforeCommit, "order-r", txmq.TxRolledBack, txmqv1.HalfState_HALF_STATE_ROLLED_BACK},
		} {
			txID := c.order + ":paid"
			arm(c.mode)
			id, err := local.Execute(t.Context(), p, txID, txmq.Message{Topic: topic, Body: []byte(c.order)},
				payOrder(c.order), txmq.WithCheckAfter(time.Second))
			require.ErrorIs(t, err, txmq.ErrOutcomeUnknown, "%s", c.order)
			require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, rb.halfState(id), "%s: left to check-back", c.order)
			txmqtest.CheckFor(t, 30*time.Second, 20*time.Millisecond, waiting(fmt.Sprintf("check-back to resolve %s", c.order), func() bool {
				return rb.halfState(id) == c.final
			}))
			require.Equal(t, c.status, txStatus(t, d, direct, txID), c.order)
			wantOrders := int64(0)
			if c.status == txmq.TxCommitted {
				wantOrders = 1
			}
			require.Equal(t, wantOrders, orderCount(t, d, direct, c.order), "%s: what the database holds", c.order)
		}
		sendMarker(t, checker, p, topic, got)
		require.Equal(t, []string{"marker", "order-c"}, bodies(got), "the committed one delivered, the other never")
	})
}
