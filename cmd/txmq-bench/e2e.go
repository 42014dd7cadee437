package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/pace"
)

// e2eRun is one e2e run: its schedule, what it measured and counts.
type e2eRun struct {
	e               *env
	topic           string
	first           time.Time
	interval        time.Duration
	w               window
	giveUp          time.Time
	half, commit    hist
	e2eLat, deliver hist
	commitAt        sync.Map
	next            atomic.Int64
	committed       atomic.Int64
	inTime          atomic.Int64
	received, errs  atomic.Int64
	late, abandoned atomic.Int64
}

func (r *e2eRun) slot(i int64) time.Time { return r.first.Add(time.Duration(i) * r.interval) }

// e2e: transactions scheduled at a fixed rate. A worker sends the half
// message ahead of its slot, then calls Commit at the slot's time (woken by
// a pace.Timer, not time.Sleep, which can wake a millisecond late);
// latency runs from the slot's time (not from when Commit was actually
// called) to the consumer, so a stall counts against every message it
// delays (no coordinated omission).
func e2e(ctx context.Context, e *env, topic string) (*result, error) {
	o := e.o
	// The first slot leaves the consumers a moment to subscribe.
	r := &e2eRun{e: e, topic: topic, first: time.Now().Add(500 * time.Millisecond), interval: time.Duration(float64(time.Second) / o.rate)}
	r.w = window{from: r.first.Add(o.warmup)}
	r.w.to = r.w.from.Add(o.duration)
	// A cluster that cannot keep up falls further behind with every slot;
	// slots not started within 10 s of the window's end are abandoned, so
	// that the run ends.
	r.giveUp = r.w.to.Add(10 * time.Second)
	stopConsumers, err := e.consumers(ctx, topic, txmq.StartEarliest, r.delivered)
	if err != nil {
		return nil, err
	}
	defer stopConsumers()
	ps, closeProducers, err := e.producers(o.e2eProducers, txmq.ProducerConfig{ProducerGroup: "bench"})
	if err != nil {
		return nil, err
	}
	defer closeProducers()

	e.meterWindow(r.w)
	// Enough workers for 50 ms of slots in flight, each with its timer.
	timers := make([]*pace.Timer, int(o.rate*0.05)+16)
	defer func() {
		for _, t := range timers {
			if t != nil {
				t.Close()
			}
		}
	}()
	for i := range timers {
		if timers[i], err = pace.New(); err != nil {
			return nil, err
		}
	}
	var wg sync.WaitGroup
	for wi, t := range timers {
		p := ps[wi%len(ps)]
		wg.Go(func() {
			for ctx.Err() == nil {
				if !r.one(ctx, p, t) {
					return
				}
			}
		})
	}
	wg.Wait()
	res := &result{Workload: "e2e", Producers: o.e2eProducers, Consumers: o.consumers, Size: o.size, Measured: o.duration}
	res.extra("rate_per_s", "scheduled commits per second", o.rate)
	drain(res, &r.committed, &r.received)
	r.report(res)
	return res, nil
}

// delivered times a first delivery from its slot and from its Commit.
func (r *e2eRun) delivered(d *txmq.Delivery, at time.Time) {
	ts := r.slot(int64(binary.BigEndian.Uint64(d.Body)))
	if !r.w.in(ts) {
		return
	}
	r.e2eLat.add(at.Sub(ts))
	if v, ok := r.commitAt.LoadAndDelete(d.MessageID); ok {
		r.deliver.add(at.Sub(v.(time.Time)))
	}
	r.received.Add(1)
}

// one takes the next slot and runs its transaction; false once the slots
// of the window are taken.
func (r *e2eRun) one(ctx context.Context, p *txmq.Producer, t *pace.Timer) bool {
	i := r.next.Add(1) - 1
	ts := r.slot(i)
	if !ts.Before(r.w.to) {
		return false
	}
	if now := time.Now(); now.After(r.giveUp) {
		// Still counted, at the latency it has already reached: a lower
		// bound.
		if r.w.in(ts) {
			r.e2eLat.add(now.Sub(ts))
			r.abandoned.Add(1)
		}
		return true
	}
	body := make([]byte, r.e.o.size)
	binary.BigEndian.PutUint64(body, uint64(i))
	t0 := time.Now()
	id, err := p.SendHalf(ctx, fmt.Sprintf("%s-%d", r.e.runID, i), txmq.Message{Topic: r.topic, Body: body})
	if err != nil {
		r.errs.Add(1)
		return true
	}
	t1 := time.Now()
	if err := t.Until(ts); err != nil {
		r.errs.Add(1)
		return true
	}
	tc := time.Now()
	in := r.w.in(ts)
	if in {
		r.commitAt.Store(id, tc)
		if tc.Sub(ts) > time.Millisecond {
			r.late.Add(1)
		}
	}
	if err := p.Commit(ctx, id); err != nil {
		r.commitAt.Delete(id)
		r.errs.Add(1)
		return true
	}
	if in {
		done := time.Now()
		r.half.add(t1.Sub(t0))
		r.commit.add(done.Sub(tc))
		r.committed.Add(1)
		if done.Before(r.w.to) {
			r.inTime.Add(1)
		}
	}
	return true
}

func (r *e2eRun) report(res *result) {
	// Throughput is what the cluster sustained: commits of the window's
	// slots that also returned within it.
	res.Ops, res.Errors = r.committed.Load(), r.errs.Load()
	// The brokers' CPU is measured over the window: the writes are those
	// of the commits that returned within it.
	res.Writes = 2 * r.inTime.Load()
	res.Throughput = float64(r.inTime.Load()) / r.e.o.duration.Seconds()
	res.extra("late_commits", "commits called over 1 ms after their slot", float64(r.late.Load()))
	if n := r.abandoned.Load(); n > 0 {
		res.extra("abandoned", "slots not started within 10 s after the window; their e2e latency is a lower bound", float64(n))
	}
	res.lat("e2e", "scheduled commit → consumer received", &r.e2eLat)
	res.lat("deliver", "commit called → consumer received", &r.deliver)
	res.lat("half", "SendHalf", &r.half)
	res.lat("commit", "Commit", &r.commit)
}
