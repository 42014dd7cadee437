package main

import (
	"context"
	"database/sql"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	txmq "github.com/txmq/txmq/client/go"
)

const orderPaid = `{"order_id":"order-42","user_id":"alice","points":120,"paid_at_ms":1764547200000}`

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func openTestPoints(t *testing.T) *Points {
	t.Helper()
	db, d, err := openDB(t.Context(), filepath.Join(t.TempDir(), "points.db"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	p, err := newPoints(t.Context(), db, d, quiet)
	require.NoError(t, err)
	return p
}

func count(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT COUNT(*) FROM `+table).Scan(&n))
	return n
}

func balance(t *testing.T, p *Points, user string) int64 {
	t.Helper()
	b, err := Balance(t.Context(), p.db, p.dialect, user)
	require.NoError(t, err)
	return b
}

// The same message handled 50 times credits its points once.
func TestHandleCreditsOnce(t *testing.T) {
	p := openTestPoints(t)
	d := &txmq.Delivery{MessageID: "000001a22ac7be7a48d582fa1bd1af94", Topic: topic, Group: pointsGroup, Body: []byte(orderPaid)}
	for attempt := range uint32(50) {
		d.Attempt = attempt + 1
		require.NoError(t, p.Handle(t.Context(), d))
	}
	require.Equal(t, int64(120), balance(t, p, "alice"))
	require.Equal(t, 1, count(t, p.db, "points_ledger"))
	require.Equal(t, 1, count(t, p.db, "consumer_record"))

	// A second message for the same order (a compensation that raced its
	// original) is applied, and changes nothing: the ledger holds one
	// credit per order.
	comp := *d
	comp.MessageID = "000001a22ac7be7a48d582fa1bd1af95"
	require.NoError(t, p.Handle(t.Context(), &comp))
	require.Equal(t, int64(120), balance(t, p, "alice"))
	require.Equal(t, 2, count(t, p.db, "consumer_record"))
}

// Deliveries of the same message handled at once still credit once.
func TestHandleCreditsOnceConcurrently(t *testing.T) {
	p := openTestPoints(t)
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			d := &txmq.Delivery{MessageID: "000001a22ac7be7a48d582fa1bd1af94", Group: pointsGroup, Attempt: 1, Body: []byte(orderPaid)}
			require.NoError(t, p.Handle(t.Context(), d))
		})
	}
	wg.Wait()
	require.Equal(t, int64(120), balance(t, p, "alice"))
	require.Equal(t, 1, count(t, p.db, "points_ledger"))
}

// A message whose handling fails leaves no trace, so its redelivery applies
// it.
func TestHandleRejectsBadEvents(t *testing.T) {
	p := openTestPoints(t)
	err := p.Handle(t.Context(), &txmq.Delivery{MessageID: "m", Group: pointsGroup, Body: []byte(`{"order_id":"order-42"}`)})
	require.ErrorIs(t, err, errBadEvent)
	err = p.Handle(t.Context(), &txmq.Delivery{MessageID: "m", Group: pointsGroup,
		Body: []byte(`{"order_id":"order-42","user_id":"alice","points":1,"kind":"bonus"}`)})
	require.ErrorIs(t, err, errBadEvent)
	require.Error(t, p.Handle(t.Context(), &txmq.Delivery{MessageID: "m", Group: pointsGroup, Body: []byte(`not json`)}))
	require.Zero(t, count(t, p.db, "consumer_record"))
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

// testEnv is the drills' world with no load and no fault: a real broker,
// the order service of scheme, the points service and the reconciliation
// job, the latter run by hand.
func testEnv(t *testing.T, scheme string) *drillEnv {
	t.Helper()
	e, err := newDrillEnv(t.Context(), drillConfig{Name: "test", Scheme: scheme, Dir: t.TempDir(), Log: quiet,
		Duplicates: 50, ReconcileEvery: time.Hour, ReconcileGrace: time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(e.close)
	return e
}

// ledger reads an order's ledger entries: message ID → points.
func ledger(t *testing.T, e *drillEnv, orderID string) map[string]int64 {
	t.Helper()
	rows, err := e.pointsDB.QueryContext(t.Context(), e.pointsD.Rebind(`SELECT message_id, points FROM points_ledger WHERE order_id = ?`), orderID)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		require.NoError(t, rows.Scan(&id, &n))
		out[id] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// Reconciliation: an order whose points row was deleted gets one
// compensation, with a message ID of its own, applied once; points without
// an order get one reversal.
func TestReconcileCompensatesAndReverses(t *testing.T) {
	for _, scheme := range []string{schemeTx, schemeOutbox} {
		t.Run(scheme, func(t *testing.T) {
			e := testEnv(t, scheme)
			ctx := t.Context()
			require.NoError(t, e.orders.Pay(ctx, Payment{OrderID: "order-1", UserID: "alice", Points: 120}))
			waitFor(t, "order-1's points", 20*time.Second, func() bool { return len(ledger(t, e, "order-1")) == 1 })
			var original string
			for id := range ledger(t, e, "order-1") {
				original = id
			}

			// The points are lost: the ledger row and the balance.
			_, err := e.pointsDB.ExecContext(ctx, `DELETE FROM points_ledger WHERE order_id = 'order-1'`)
			require.NoError(t, err)
			_, err = e.pointsDB.ExecContext(ctx, `UPDATE points_balance SET balance = balance - 120 WHERE user_id = 'alice'`)
			require.NoError(t, err)
			// And points were credited for an order that does not exist.
			_, err = e.pointsDB.ExecContext(ctx, `INSERT INTO points_ledger (message_id, order_id, user_id, points, entry, order_paid_at, applied_at)
				VALUES ('forged', 'order-ghost', 'mallory', 300, 'credit', ?, ?)`, time.Now().Add(-time.Second).UnixMilli(), time.Now().UnixMilli())
			require.NoError(t, err)
			_, err = e.pointsDB.ExecContext(ctx, `INSERT INTO points_balance (user_id, balance) VALUES ('mallory', 300)`)
			require.NoError(t, err)

			rep, err := e.rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Len(t, rep.Actions, 2)
			require.Equal(t, "compensate:order_paid:order-1:1", rep.Actions[0].ID)
			require.Equal(t, "reverse:order_paid:order-ghost:1", rep.Actions[1].ID)
			require.Empty(t, rep.Mismatches)

			// The handler counts an action after its database transaction
			// commits, so the ledger can show both before the count does.
			waitFor(t, "the compensation and the reversal", 20*time.Second, func() bool {
				e.mu.Lock()
				counted := e.actions
				e.mu.Unlock()
				return counted >= 2 && len(ledger(t, e, "order-1")) == 1 && len(ledger(t, e, "order-ghost")) == 2
			})
			for id, n := range ledger(t, e, "order-1") {
				require.NotEqual(t, original, id, "the compensation has a message ID of its own")
				require.Equal(t, int64(120), n)
			}
			require.Equal(t, int64(120), balance(t, e.points, "alice"))
			require.Zero(t, balance(t, e.points, "mallory"))

			// Consistent again: nothing more is emitted, and the
			// compensation was applied once.
			rep, err = e.rec.RunOnce(ctx)
			require.NoError(t, err)
			require.Empty(t, rep.Actions)
			e.mu.Lock()
			defer e.mu.Unlock()
			require.Equal(t, 2, e.actions)
			for id, n := range e.applies {
				require.Equal(t, 1, n, "message %s applied once", id)
			}
		})
	}
}

// The five drills in short mode, on both schemes: every order gets its
// points, none twice, none for a failed local transaction. The figures are
// logged; they are not asserted.
func TestDrillsShort(t *testing.T) {
	var results []drillResult
	for _, name := range drillNames {
		for _, scheme := range []string{schemeTx, schemeOutbox} {
			t.Run(name+"/"+scheme, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
				defer cancel()
				res, err := runDrill(ctx, drillConfig{Name: name, Scheme: scheme, FaultFor: 2 * time.Second,
					Warmup: time.Second, Cooldown: time.Second, Rate: 20, Duplicates: 50,
					ReconcileEvery: time.Second, ReconcileGrace: 10 * time.Second, Dir: t.TempDir(), Log: quiet})
				require.NoError(t, err)
				results = append(results, res)
				require.Positive(t, res.Orders)
				require.Equal(t, res.Orders, res.Correct, "completeness 100 %%")
				require.Zero(t, res.Duplicates, "duplicates applied")
				require.Zero(t, res.Ghosts, "credits for failed local transactions")
				require.True(t, res.passed())
			})
		}
	}
	var table strings.Builder
	printHeader(&table)
	for _, r := range results {
		printResult(&table, r)
	}
	printNotes(&table, results)
	t.Log("\n" + table.String())
}
