package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
)

// env is what a workload runs with.
type env struct {
	o     *options
	c     cluster
	m     *meter
	runID string
}

func (e *env) producer(group string, checker txmq.Checker) (*txmq.Producer, error) {
	return txmq.NewProducer(txmq.ProducerConfig{Addrs: e.c.addrs(), ProducerGroup: group, Checker: checker, Logger: quiet})
}

func (e *env) producers(n int, group string) ([]*txmq.Producer, func(), error) {
	var ps []*txmq.Producer
	closeAll := func() {
		for _, p := range ps {
			p.Close()
		}
	}
	for range n {
		p, err := e.producer(group, nil)
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		ps = append(ps, p)
	}
	return ps, closeAll, nil
}

// consumers runs --consumers members of one group on topic, passing each
// first delivery and the time it arrived to h (which acks it). stop ends
// them.
func (e *env) consumers(ctx context.Context, topic string, start txmq.StartPosition, h func(d *txmq.Delivery, at time.Time)) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop = func() {
		cancel()
		wg.Wait()
	}
	for range e.o.consumers {
		c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: e.c.addrs(), Topic: topic, Group: "bench-consumers", Start: start, Logger: quiet})
		if err != nil {
			stop()
			return nil, err
		}
		wg.Go(func() {
			defer c.Close()
			_ = c.Run(ctx, func(_ context.Context, d *txmq.Delivery) error {
				if d.Attempt == 1 {
					h(d, time.Now())
				}
				return nil
			})
		})
	}
	return stop, nil
}

// meterWindow starts the meter when the window opens and stops it when it
// closes.
func (e *env) meterWindow(w window) {
	go func() {
		time.Sleep(time.Until(w.from))
		e.m.start()
		time.Sleep(time.Until(w.to))
		e.m.stop()
	}()
}

// drain waits until the consumers got every message committed in the
// window, at most 10 s, and notes what is missing.
func drain(res *result, committed, received *atomic.Int64) {
	deadline := time.Now().Add(10 * time.Second)
	for received.Load() < committed.Load() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if missing := committed.Load() - received.Load(); missing > 0 {
		res.extra("deliver_missing", "committed in the window, not received within 10 s", float64(missing))
	}
}

// closedLoop: each producer sends its next message (tx: SendHalf then
// Commit; send: Send) as soon as the previous one returned.
func closedLoop(ctx context.Context, e *env, kind string, producers int, topic string, start txmq.StartPosition) (*result, error) {
	o := e.o
	res := &result{Workload: kind, Producers: producers, Consumers: o.consumers, Size: o.size, Measured: o.duration}
	var half, commit, txn, send, deliver hist
	var commitAt sync.Map // message ID -> when Commit was called, for measured transactions
	var committed, received, errs atomic.Int64
	w := window{from: time.Now().Add(o.warmup)}
	w.to = w.from.Add(o.duration)

	stopConsumers, err := e.consumers(ctx, topic, start, func(d *txmq.Delivery, at time.Time) {
		var t0 time.Time
		if kind == "send" {
			// The body starts with the time Send was called.
			t0 = time.Unix(0, int64(binary.BigEndian.Uint64(d.Body)))
			if !w.in(t0) {
				return
			}
		} else {
			v, ok := commitAt.LoadAndDelete(d.MessageID)
			if !ok {
				return
			}
			t0 = v.(time.Time)
		}
		deliver.add(at.Sub(t0))
		received.Add(1)
	})
	if err != nil {
		return nil, err
	}
	defer stopConsumers()
	ps, closeProducers, err := e.producers(producers, "bench")
	if err != nil {
		return nil, err
	}
	defer closeProducers()

	e.meterWindow(w)
	var wg sync.WaitGroup
	for pi, p := range ps {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				t0 := time.Now()
				if !t0.Before(w.to) {
					return
				}
				in := w.in(t0)
				body := make([]byte, o.size)
				if kind == "send" {
					binary.BigEndian.PutUint64(body, uint64(t0.UnixNano()))
					if _, err := p.Send(ctx, txmq.Message{Topic: topic, Body: body}); err != nil {
						errs.Add(1)
						continue
					}
					if in {
						send.add(time.Since(t0))
						committed.Add(1)
					}
					continue
				}
				id, err := p.SendHalf(ctx, fmt.Sprintf("%s-%d-%d", e.runID, pi, i), txmq.Message{Topic: topic, Body: body})
				if err != nil {
					errs.Add(1)
					continue
				}
				t1 := time.Now()
				if in {
					commitAt.Store(id, t1)
				}
				if err := p.Commit(ctx, id); err != nil {
					commitAt.Delete(id)
					errs.Add(1)
					continue
				}
				if in {
					t2 := time.Now()
					half.add(t1.Sub(t0))
					commit.add(t2.Sub(t1))
					txn.add(t2.Sub(t0))
					committed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	drain(res, &committed, &received)

	res.Ops, res.Errors = committed.Load(), errs.Load()
	res.Writes = 2 * res.Ops
	if kind == "send" {
		res.Writes = res.Ops
	}
	res.Throughput = float64(res.Ops) / o.duration.Seconds()
	if kind == "send" {
		res.lat("send", "Send", &send)
	} else {
		res.lat("half", "SendHalf", &half)
		res.lat("commit", "Commit", &commit)
		res.lat("txn", "whole transaction", &txn)
	}
	res.lat("deliver", "commit called → consumer received", &deliver)
	return res, nil
}

// e2e: transactions scheduled at a fixed rate. A worker sends the half
// message ahead of its slot, then calls Commit at the slot's time; latency
// runs from the slot's time (not from when Commit was actually called) to
// the consumer, so a stall counts against every message it delays
// (no coordinated omission).
func e2e(ctx context.Context, e *env, topic string) (*result, error) {
	o := e.o
	res := &result{Workload: "e2e", Producers: o.e2eProducers, Consumers: o.consumers, Size: o.size, Measured: o.duration}
	res.extra("rate_per_s", "scheduled commits per second", o.rate)
	interval := time.Duration(float64(time.Second) / o.rate)
	// The first slot leaves the consumers a moment to subscribe.
	first := time.Now().Add(500 * time.Millisecond)
	slot := func(i int64) time.Time { return first.Add(time.Duration(i) * interval) }
	w := window{from: first.Add(o.warmup)}
	w.to = w.from.Add(o.duration)

	// A cluster that cannot keep up falls further behind with every slot;
	// slots not started within 10 s of the window's end are abandoned, so
	// that the run ends.
	giveUp := w.to.Add(10 * time.Second)
	var half, commit, e2eLat, deliver hist
	var commitAt sync.Map
	var committed, inTime, received, errs, late, abandoned atomic.Int64
	stopConsumers, err := e.consumers(ctx, topic, txmq.StartEarliest, func(d *txmq.Delivery, at time.Time) {
		ts := slot(int64(binary.BigEndian.Uint64(d.Body)))
		if !w.in(ts) {
			return
		}
		e2eLat.add(at.Sub(ts))
		if v, ok := commitAt.LoadAndDelete(d.MessageID); ok {
			deliver.add(at.Sub(v.(time.Time)))
		}
		received.Add(1)
	})
	if err != nil {
		return nil, err
	}
	defer stopConsumers()
	ps, closeProducers, err := e.producers(o.e2eProducers, "bench")
	if err != nil {
		return nil, err
	}
	defer closeProducers()

	e.meterWindow(w)
	// Enough workers for 50 ms of slots in flight.
	workers := int(o.rate*0.05) + 16
	var next atomic.Int64
	var wg sync.WaitGroup
	for wi := range workers {
		p := ps[wi%len(ps)]
		wg.Go(func() {
			for ctx.Err() == nil {
				i := next.Add(1) - 1
				ts := slot(i)
				if !ts.Before(w.to) {
					return
				}
				if now := time.Now(); now.After(giveUp) {
					// Still counted, at the latency it has already
					// reached: a lower bound.
					if w.in(ts) {
						e2eLat.add(now.Sub(ts))
						abandoned.Add(1)
					}
					continue
				}
				body := make([]byte, o.size)
				binary.BigEndian.PutUint64(body, uint64(i))
				t0 := time.Now()
				id, err := p.SendHalf(ctx, fmt.Sprintf("%s-%d", e.runID, i), txmq.Message{Topic: topic, Body: body})
				if err != nil {
					errs.Add(1)
					continue
				}
				t1 := time.Now()
				time.Sleep(time.Until(ts))
				tc := time.Now()
				in := w.in(ts)
				if in {
					commitAt.Store(id, tc)
					if tc.Sub(ts) > time.Millisecond {
						late.Add(1)
					}
				}
				if err := p.Commit(ctx, id); err != nil {
					commitAt.Delete(id)
					errs.Add(1)
					continue
				}
				if in {
					done := time.Now()
					half.add(t1.Sub(t0))
					commit.add(done.Sub(tc))
					committed.Add(1)
					if done.Before(w.to) {
						inTime.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	drain(res, &committed, &received)

	// Throughput is what the cluster sustained: commits of the window's
	// slots that also returned within it.
	res.Ops, res.Errors = committed.Load(), errs.Load()
	// The brokers' CPU is measured over the window: the writes are those
	// of the commits that returned within it.
	res.Writes = 2 * inTime.Load()
	res.Throughput = float64(inTime.Load()) / o.duration.Seconds()
	res.extra("late_commits", "commits called over 1 ms after their slot", float64(late.Load()))
	if n := abandoned.Load(); n > 0 {
		res.extra("abandoned", "slots not started within 10 s after the window; their e2e latency is a lower bound", float64(n))
	}
	res.lat("e2e", "scheduled commit → consumer received", &e2eLat)
	res.lat("deliver", "commit called → consumer received", &deliver)
	res.lat("half", "SendHalf", &half)
	res.lat("commit", "Commit", &commit)
	return res, nil
}

// checkbackRun: --orphans half messages whose producer never commits, all
// due for a check; then a producer of the group comes up answering COMMIT.
// Throughput is resolved half messages per second, from the producer's
// start until the broker lists none of them pending.
func checkbackRun(ctx context.Context, e *env, topic string) (*result, error) {
	o := e.o
	group := "bench-orphans-" + e.runID
	res := &result{Workload: "checkback", Producers: 1, Size: o.size}
	res.extra("orphans", "half messages left pending", float64(o.orphans))

	ps, closeProducers, err := e.producers(4, group)
	if err != nil {
		return nil, err
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var firstErr error
	var errOnce sync.Once
	for wi := range 16 {
		p := ps[wi%len(ps)]
		wg.Go(func() {
			for i := next.Add(1); i <= int64(o.orphans) && ctx.Err() == nil; i = next.Add(1) {
				_, err := p.SendHalf(ctx, fmt.Sprint("orphan-", i), txmq.Message{Topic: topic, Body: make([]byte, o.size)}, txmq.WithCheckAfter(time.Second))
				if err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	closeProducers()
	if firstErr != nil {
		return nil, fmt.Errorf("checkback: sending orphans: %w", firstErr)
	}
	// Every orphan is due one second after it was stored.
	time.Sleep(1200 * time.Millisecond)

	admin, closeAdmin, err := adminClients(e.c.addrs())
	if err != nil {
		return nil, err
	}
	defer closeAdmin()
	var checks atomic.Int64
	e.m.start()
	t0 := time.Now()
	p, err := e.producer(group, func(context.Context, txmq.HalfMessage) (txmq.Resolution, error) {
		checks.Add(1)
		return txmq.Commit, nil
	})
	if err != nil {
		return nil, err
	}
	defer p.Close()
	limit := time.Minute + time.Duration(o.orphans)*time.Millisecond
	for {
		n, err := pending(ctx, admin, group)
		if err == nil && n == 0 {
			break
		}
		if time.Since(t0) > limit {
			return nil, fmt.Errorf("checkback: orphans still pending after %s (last error: %v)", limit, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(t0)
	e.m.stop()
	res.Measured = elapsed
	res.Ops, res.Writes = int64(o.orphans), int64(o.orphans)
	res.Throughput = float64(o.orphans) / elapsed.Seconds()
	res.extra("checks_answered", "check-backs the producer answered", float64(checks.Load()))
	return res, nil
}

func adminClients(addrs []string) ([]txmqv1.AdminServiceClient, func(), error) {
	var conns []*grpc.ClientConn
	var out []txmqv1.AdminServiceClient
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for _, a := range addrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, cc)
		out = append(out, txmqv1.NewAdminServiceClient(cc))
	}
	return out, closeAll, nil
}

// pending is 0 when the leader lists no pending half message of group, 1
// otherwise. Followers refuse the call; the leader answers.
func pending(ctx context.Context, admin []txmqv1.AdminServiceClient, group string) (int, error) {
	var lastErr error
	for _, a := range admin {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		r, err := a.ListHalfMessages(actx, &txmqv1.ListHalfMessagesRequest{ProducerGroup: group, State: txmqv1.HalfState_HALF_STATE_PENDING, Limit: 1})
		cancel()
		if err == nil {
			return len(r.GetMessages()), nil
		}
		lastErr = err
	}
	return 0, lastErr
}
