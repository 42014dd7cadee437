package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	txmq "github.com/txmq/txmq/client/go"
)

// The drills of seed 003 §5.3, and the incident's own.
const (
	drillConsumerStopped = "consumer-stopped"
	drillBrokerDown      = "broker-down"
	drillDuplicates      = "duplicates"
	drillAckLost         = "ack-lost"
	drillLocalTxFails    = "local-tx-fails"
)

var drillNames = []string{drillConsumerStopped, drillBrokerDown, drillDuplicates, drillAckLost, drillLocalTxFails}

// drillConfig configures one drill.
type drillConfig struct {
	Name   string
	Scheme string
	// FaultFor is how long the fault lasts (drills 1, 2, 4, 5).
	FaultFor time.Duration
	// Warmup and Cooldown are the steady load before the fault and after
	// the recovery: their latencies are the steady ones.
	Warmup, Cooldown time.Duration
	// Rate is the orders paid per second.
	Rate int
	// Duplicates is how often drill 3 delivers its messages.
	Duplicates uint32
	// Addr is an external broker; empty starts one in this process.
	Addr                 string
	OrdersDSN, PointsDSN string
	// ReconcileEvery and ReconcileGrace run the reconciliation job.
	ReconcileEvery, ReconcileGrace time.Duration
	// Dir holds the broker's and SQLite's files.
	Dir       string
	removeDir bool
	Log       *slog.Logger
}

// drillResult is what a drill measured.
type drillResult struct {
	Drill, Scheme string
	// Orders is the paid orders, Correct those whose points are right.
	Orders, Correct int
	// Duplicates is the applications beyond the first of a message, plus
	// orders credited more than their points.
	Duplicates int
	// Ghosts is credits for orders whose local transaction failed.
	Ghosts int
	// Actions is reconciliation's compensations and reversals applied.
	Actions int
	// Recovery is from the fault's end until every order paid before it
	// had its points.
	Recovery time.Duration
	// Latency is order paid → points applied, over all orders and over
	// those outside the fault window.
	All, Steady percentiles
	Note        string
}

func (r drillResult) completeness() float64 {
	if r.Orders == 0 {
		return 0
	}
	return 100 * float64(r.Correct) / float64(r.Orders)
}

// passed: every order has its points, none twice, no ghost.
func (r drillResult) passed() bool {
	return r.Orders > 0 && r.Correct == r.Orders && r.Duplicates == 0 && r.Ghosts == 0
}

// runDrill runs one drill end to end and returns its figures.
func runDrill(ctx context.Context, cfg drillConfig) (drillResult, error) {
	e, err := newDrillEnv(ctx, cfg)
	if err != nil {
		return drillResult{}, err
	}
	defer e.close()
	l := newLoad(e)
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	go l.run(loadCtx)

	if err := sleepCtx(ctx, cfg.Warmup); err != nil {
		return drillResult{}, err
	}
	faultStart := time.Now()
	note, err := injectFault(ctx, e, l)
	if err != nil {
		return drillResult{}, err
	}
	faultEnd := time.Now()
	recovery, err := l.waitRecovered(ctx, faultEnd)
	if err != nil {
		return drillResult{}, err
	}
	if err := sleepCtx(ctx, cfg.Cooldown); err != nil {
		return drillResult{}, err
	}
	stopLoad()
	l.wait()
	if err := l.waitDrained(ctx); err != nil {
		return drillResult{}, err
	}
	if cfg.Name == drillLocalTxFails && cfg.Scheme == schemeTx {
		rolledBack, err := l.waitRolledBack(ctx, faultEnd)
		if err != nil {
			return drillResult{}, err
		}
		note += rolledBack
	}
	res, err := l.measure(ctx, faultStart, faultEnd.Add(recovery))
	if err != nil {
		return drillResult{}, err
	}
	res.Drill, res.Scheme, res.Recovery = cfg.Name, cfg.Scheme, recovery
	res.Note = note + res.Note + e.note()
	return res, nil
}

// injectFault runs the drill's fault and returns when it ends, with a note
// on what it did.
func injectFault(ctx context.Context, e *drillEnv, l *load) (string, error) {
	cfg := e.cfg
	switch cfg.Name {
	case drillConsumerStopped:
		e.stopConsumer()
		if err := sleepCtx(ctx, cfg.FaultFor); err != nil {
			return "", err
		}
		return fmt.Sprintf("consumer stopped %v", cfg.FaultFor), e.startConsumer()
	case drillBrokerDown:
		if e.broker == nil {
			return "", errors.New("the broker-down drill stops the broker, so it needs the in-process one (no --addr)")
		}
		e.broker.stop()
		if err := sleepCtx(ctx, cfg.FaultFor); err != nil {
			return "", err
		}
		return fmt.Sprintf("broker down %v", cfg.FaultFor), e.broker.start()
	case drillDuplicates:
		return duplicatesFault(ctx, e, l)
	case drillAckLost:
		e.dropAcks.Store(true)
		err := sleepCtx(ctx, cfg.FaultFor)
		e.dropAcks.Store(false)
		return fmt.Sprintf("acks dropped for %v: %d", cfg.FaultFor, e.acksDropped.Load()), err
	case drillLocalTxFails:
		l.failing.Store(true)
		err := sleepCtx(ctx, cfg.FaultFor)
		l.failing.Store(false)
		where := "after SendHalf"
		if cfg.Scheme == schemeOutbox {
			where = "before their commit"
		}
		return fmt.Sprintf("local transactions failed for %v: %d rejected, %d abandoned %s",
			cfg.FaultFor, l.rejected.Load(), l.abandoned.Load(), where), err
	}
	return "", fmt.Errorf("unknown drill %q; the drills: %v", cfg.Name, drillNames)
}

// duplicatesFault marks the next three orders to be delivered
// cfg.Duplicates times each (nacked after their commit, as if the consumer
// crashed before the ack), and waits until they have been.
func duplicatesFault(ctx context.Context, e *drillEnv, l *load) (string, error) {
	next := l.peekNext()
	ids := []string{orderID(e.cfg, next), orderID(e.cfg, next+1), orderID(e.cfg, next+2)}
	e.mu.Lock()
	for _, id := range ids {
		e.crash[id] = e.cfg.Duplicates
	}
	e.mu.Unlock()
	deadline := time.Now().Add(2*time.Minute + time.Duration(e.cfg.Duplicates)*time.Second)
	for {
		e.mu.Lock()
		done := 0
		for _, id := range ids {
			if e.deliveries[id] >= e.cfg.Duplicates {
				done++
			}
		}
		e.mu.Unlock()
		if done == len(ids) {
			return fmt.Sprintf("%d orders delivered %d times each", len(ids), e.cfg.Duplicates), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("drill %s: the marked orders were not delivered %d times", e.cfg.Name, e.cfg.Duplicates)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return "", err
		}
	}
}

func (e *drillEnv) note() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := fmt.Sprintf("; redeliveries %d", e.redelivered)
	if e.blocked > 0 {
		s += fmt.Sprintf("; %d applies stopped by the ledger key", e.blocked)
	}
	return s
}

func orderID(cfg drillConfig, i int) string {
	return fmt.Sprintf("%s-%s-%06d", cfg.Name, cfg.Scheme, i)
}

func decodeEvent(body []byte) (OrderPaid, error) {
	var ev OrderPaid
	err := json.Unmarshal(body, &ev)
	return ev, err
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// retryable reports whether a payment callback that failed with err should
// be sent again by the provider: the broker or the database was away, or
// the commit's outcome is unknown. A rejected payment is not.
func retryable(err error) bool {
	return !errors.Is(err, errPaymentRejected) && !errors.Is(err, txmq.ErrConflict) && !errors.Is(err, errBadEvent)
}
