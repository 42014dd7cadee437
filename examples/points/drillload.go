package main

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/client/go/outbox"
)

// load pays orders at a steady rate, as a payment provider's callbacks
// would, and sends a callback that failed again until it succeeds (with the
// same order ID: the order service is idempotent). During drill 5's fault a
// third of the orders have their local transaction fail and a third are
// abandoned after SendHalf, as if the process died before its database
// commit.
type load struct {
	e       *drillEnv
	next    atomic.Int64 // the next order number to issue
	queue   chan int
	wg      sync.WaitGroup
	failing atomic.Bool

	rejected, abandoned atomic.Int64
	mu                  sync.Mutex
	accepted            map[string]bool
	given               []string // given up on: not accepted, not meant to fail
	givenIDs            map[string]bool
	halves              []string // abandoned half messages (tx scheme)
}

const loadWorkers = 8

func newLoad(e *drillEnv) *load {
	return &load{e: e, queue: make(chan int, 1<<16), accepted: map[string]bool{}, givenIDs: map[string]bool{}}
}

func (l *load) run(ctx context.Context) {
	for range loadWorkers {
		l.wg.Go(func() {
			for i := range l.queue {
				l.pay(i)
			}
		})
	}
	t := time.NewTicker(time.Second / time.Duration(l.e.cfg.Rate))
	defer t.Stop()
	defer close(l.queue)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			select {
			case l.queue <- int(l.next.Add(1) - 1):
			case <-ctx.Done():
				return
			}
		}
	}
}

func (l *load) peekNext() int { return int(l.next.Load()) }

// wait returns once the issued orders are all paid or given up on.
func (l *load) wait() { l.wg.Wait() }

func (l *load) pay(i int) {
	cfg := l.e.cfg
	id := orderID(cfg, i)
	p := Payment{OrderID: id, UserID: fmt.Sprintf("user-%d", i%10), Points: int64(10 + i%90)}
	// A callback is retried for up to a minute past the fault.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.FaultFor+time.Minute)
	defer cancel()
	if l.failing.Load() && i%3 != 2 {
		l.e.mu.Lock()
		l.e.failed[id] = true
		l.e.mu.Unlock()
		if i%3 == 0 {
			err := l.e.orders.Pay(ctx, p)
			l.rejected.Add(1)
			if err == nil {
				l.giveUp(id, "a rejected local transaction was paid")
			}
			return
		}
		l.abandon(ctx, p)
		return
	}
	wait := 50 * time.Millisecond
	for {
		err := l.e.orders.Pay(ctx, p)
		if err == nil {
			l.mu.Lock()
			l.accepted[id] = true
			l.mu.Unlock()
			return
		}
		if !retryable(err) || sleepCtx(ctx, wait) != nil {
			l.e.log.Error("drill: payment given up", "order", id, "err", err)
			l.giveUp(id, err.Error())
			return
		}
		wait = min(2*wait, time.Second)
	}
}

func (l *load) giveUp(id, why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.given = append(l.given, id+": "+why)
	l.givenIDs[id] = true
}

// abandon is a process that died in the middle of an order: after SendHalf
// and before its database commit (tx scheme), or before its commit of the
// order and the outbox row (outbox scheme).
func (l *load) abandon(ctx context.Context, p Payment) {
	l.abandoned.Add(1)
	o := l.e.orders
	body := fmt.Appendf(nil, `{"order_id":%q,"user_id":%q,"points":%d,"paid_at_ms":%d,"kind":"credit"}`,
		p.OrderID, p.UserID, p.Points, time.Now().UnixMilli())
	if o.scheme == schemeTx {
		id, err := o.producer.SendHalf(ctx, p.OrderID+":paid", txmq.Message{Topic: topic, Body: body}, txmq.WithCheckAfter(o.checkAfter))
		if err != nil {
			l.e.log.Warn("drill: SendHalf of an abandoned order failed", "order", p.OrderID, "err", err)
			return
		}
		l.mu.Lock()
		l.halves = append(l.halves, id)
		l.mu.Unlock()
		return
	}
	tx, err := o.db.BeginTx(ctx, nil)
	if err != nil {
		return
	}
	defer tx.Rollback()
	_ = o.outbox.Write(ctx, tx, outbox.Message{ID: p.OrderID + ":paid", Topic: topic, Body: body})
}

// waitRolledBack waits until check-back has rolled back every abandoned
// half message, and says how long that took after the fault's end.
func (l *load) waitRolledBack(ctx context.Context, faultEnd time.Time) (string, error) {
	l.mu.Lock()
	halves := slices.Clone(l.halves)
	l.mu.Unlock()
	deadline := time.Now().Add(time.Minute)
	for _, id := range halves {
		for {
			r, err := l.e.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: id})
			if err != nil {
				return "", err
			}
			st := r.GetMessage().GetState()
			if st == txmqv1.HalfState_HALF_STATE_ROLLED_BACK {
				break
			}
			if st != txmqv1.HalfState_HALF_STATE_PENDING || time.Now().After(deadline) {
				return "", fmt.Errorf("drill %s: abandoned half message %s is %s, not rolled back", l.e.cfg.Name, id, st)
			}
			if err := sleepCtx(ctx, 50*time.Millisecond); err != nil {
				return "", err
			}
		}
	}
	return fmt.Sprintf("; check-back rolled back all %d abandoned half messages by %v after the fault",
		len(halves), time.Since(faultEnd).Round(time.Millisecond)), nil
}

// credited reads which orders have a credit in the ledger, and when it was
// applied.
func (l *load) credited(ctx context.Context) (map[string]int64, error) {
	return idInts(ctx, l.e.pointsDB, `SELECT order_id, applied_at FROM points_ledger WHERE entry = 'credit'`)
}

// missing counts the orders numbered below n that should have their points
// and do not yet. Orders the load gave up on are left to measure, which
// counts them as incomplete.
func (l *load) missing(ctx context.Context, n int) (int, error) {
	got, err := l.credited(ctx)
	if err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.e.mu.Lock()
	defer l.e.mu.Unlock()
	missing := 0
	for i := range n {
		id := orderID(l.e.cfg, i)
		if _, ok := got[id]; !ok && !l.e.failed[id] && !l.givenIDs[id] {
			missing++
		}
	}
	return missing, nil
}

// waitRecovered waits until every order issued before the fault's end has
// its points, and returns how long that took.
func (l *load) waitRecovered(ctx context.Context, faultEnd time.Time) (time.Duration, error) {
	n := l.peekNext()
	deadline := faultEnd.Add(l.e.cfg.FaultFor + 2*time.Minute)
	for {
		m, err := l.missing(ctx, n)
		if err != nil {
			return 0, err
		}
		if m == 0 {
			return time.Since(faultEnd), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("drill %s: %d of the %d orders issued before the fault ended still have no points after %v",
				l.e.cfg.Name, m, n, time.Since(faultEnd).Round(time.Second))
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// waitDrained waits, up to a minute, for the points of the last orders.
func (l *load) waitDrained(ctx context.Context) error {
	n := l.peekNext()
	deadline := time.Now().Add(time.Minute)
	for {
		m, err := l.missing(ctx, n)
		if err != nil || m == 0 || time.Now().After(deadline) {
			return err
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
}

type orderRow struct {
	points, paidAt int64
}

func readOrders(ctx context.Context, db *sql.DB) (map[string]orderRow, error) {
	rows, err := db.QueryContext(ctx, `SELECT order_id, points, paid_at FROM orders`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]orderRow{}
	for rows.Next() {
		var id string
		var o orderRow
		if err := rows.Scan(&id, &o.points, &o.paidAt); err != nil {
			return nil, err
		}
		out[id] = o
	}
	return out, rows.Err()
}

func netPoints(ctx context.Context, db *sql.DB) (map[string]int64, error) {
	return idInts(ctx, db, `SELECT order_id, SUM(points) FROM points_ledger GROUP BY order_id`)
}

// idInts runs a query of (order ID, number) rows into a map.
func idInts(ctx context.Context, db *sql.DB, q string) (map[string]int64, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

// steadyMargin leaves out of the steady latencies the orders paid just
// before the fault, whose messages were in flight when it struck.
const steadyMargin = time.Second

// measure compares the orders with the points and computes the latencies;
// steady latencies are those of orders paid before faultStart or after
// steadyFrom.
func (l *load) measure(ctx context.Context, faultStart, steadyFrom time.Time) (drillResult, error) {
	orders, err := readOrders(ctx, l.e.ordersDB)
	if err != nil {
		return drillResult{}, err
	}
	net, err := netPoints(ctx, l.e.pointsDB)
	if err != nil {
		return drillResult{}, err
	}
	applied, err := l.credited(ctx)
	if err != nil {
		return drillResult{}, err
	}
	var r drillResult
	var all, steady []time.Duration
	// Every order paid, accepted or given up on should have its points:
	// one accepted or given up on yet not in the database is incomplete.
	l.mu.Lock()
	r.Orders = len(orders)
	for _, ids := range []map[string]bool{l.accepted, l.givenIDs} {
		for id := range ids {
			if _, ok := orders[id]; !ok {
				orders[id] = orderRow{points: -1}
				r.Orders++
			}
		}
	}
	if len(l.given) > 0 {
		r.Note = fmt.Sprintf("; %d payments given up, e.g. %s", len(l.given), l.given[0])
	}
	l.mu.Unlock()
	for id, o := range orders {
		if o.points < 0 {
			continue // not in the database: incomplete
		}
		switch n := net[id]; {
		case n == o.points:
			r.Correct++
		case n > o.points:
			r.Duplicates++
		}
		at, ok := applied[id]
		if !ok {
			continue
		}
		lat := time.Duration(at-o.paidAt) * time.Millisecond
		all = append(all, lat)
		if paid := time.UnixMilli(o.paidAt); paid.Before(faultStart.Add(-steadyMargin)) || paid.After(steadyFrom) {
			steady = append(steady, lat)
		}
	}
	l.e.mu.Lock()
	for _, n := range l.e.applies {
		r.Duplicates += n - 1
	}
	r.Ghosts, r.Actions = l.e.ghosts, l.e.actions
	l.e.mu.Unlock()
	r.All, r.Steady = percentilesOf(all), percentilesOf(steady)
	return r, nil
}

type percentiles struct {
	N             int
	P50, P95, P99 time.Duration
}

func percentilesOf(d []time.Duration) percentiles {
	if len(d) == 0 {
		return percentiles{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return percentiles{N: len(d), P50: at(0.50), P95: at(0.95), P99: at(0.99)}
}
