package main

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
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
	// tls is the clients' TLS configuration, nil for plaintext.
	tls *tls.Config
	// token is the clients' bearer token, "" without auth.
	token string
}

// producer is a producer on the bench's cluster with cfg's group,
// Checker and options (the cluster, TLS, token and logger are the bench's).
func (e *env) producer(cfg txmq.ProducerConfig) (*txmq.Producer, error) {
	cfg.Addrs, cfg.TLS, cfg.Token, cfg.Logger = e.c.addrs(), e.tls, e.token, quiet
	return txmq.NewProducer(cfg)
}

// loopProducers are the closed loops' n producers: a Producer each, or
// with --one-producer n uses of one Producer, whose session carries the
// writes of all n goroutines.
func (e *env) loopProducers(n int, cfg txmq.ProducerConfig) ([]*txmq.Producer, func(), error) {
	if !e.o.oneProducer {
		return e.producers(n, cfg)
	}
	ps, closeAll, err := e.producers(1, cfg)
	if err != nil {
		return nil, nil, err
	}
	return slices.Repeat(ps, n), closeAll, nil
}

func (e *env) producers(n int, cfg txmq.ProducerConfig) ([]*txmq.Producer, func(), error) {
	var ps []*txmq.Producer
	closeAll := func() {
		for _, p := range ps {
			p.Close()
		}
	}
	for range n {
		p, err := e.producer(cfg)
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
		c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: e.c.addrs(), TLS: e.tls, Token: e.token, Topic: topic, Group: "bench-consumers", Start: start, Logger: quiet})
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

// loopRun is one closedLoop run: its window, what it measured and counts.
type loopRun struct {
	e                         *env
	kind, topic               string
	w                         window
	half, commit, txn, send   hist
	deliver                   hist
	commitAt                  sync.Map // message ID -> when Commit was called, for measured transactions
	committed, received, errs atomic.Int64
	checks                    atomic.Int64 // tx-oneway: check-backs answered
}

// closedLoop: each producer sends its next message (tx: SendHalf then
// Commit; tx-oneway: the same with producers whose Commit returns once the
// commit is sent; send: Send) as soon as the previous one returned.
func closedLoop(ctx context.Context, e *env, kind string, producers int, topic string, start txmq.StartPosition) (*result, error) {
	o := e.o
	r := &loopRun{e: e, kind: kind, topic: topic, w: window{from: time.Now().Add(o.warmup)}}
	r.w.to = r.w.from.Add(o.duration)
	stopConsumers, err := e.consumers(ctx, topic, start, r.delivered)
	if err != nil {
		return nil, err
	}
	defer stopConsumers()
	cfg := txmq.ProducerConfig{ProducerGroup: "bench"}
	if kind == "tx-oneway" {
		// A one-way commit that is lost leaves its half message pending
		// until check-back commits it, so the client wants a Checker.
		cfg.OnewayCommit, cfg.Checker = true, commitAll(&r.checks)
	}
	ps, closeProducers, err := e.loopProducers(producers, cfg)
	if err != nil {
		return nil, err
	}
	defer closeProducers()

	e.meterWindow(r.w)
	var wg sync.WaitGroup
	for pi, p := range ps {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				t0 := time.Now()
				if !t0.Before(r.w.to) {
					return
				}
				r.one(ctx, p, pi, i, t0)
			}
		})
	}
	wg.Wait()
	res := &result{Workload: kind, Producers: producers, OneProducer: o.oneProducer, Consumers: o.consumers, Size: o.size, Measured: o.duration}
	drain(res, &r.committed, &r.received)
	r.report(res)
	return res, nil
}

// delivered times a first delivery from when its Send (the time is the
// body's first 8 bytes) or its Commit was called.
func (r *loopRun) delivered(d *txmq.Delivery, at time.Time) {
	var t0 time.Time
	if r.kind == "send" {
		t0 = time.Unix(0, int64(binary.BigEndian.Uint64(d.Body)))
		if !r.w.in(t0) {
			return
		}
	} else {
		v, ok := r.commitAt.LoadAndDelete(d.MessageID)
		if !ok {
			return
		}
		t0 = v.(time.Time)
	}
	r.deliver.add(at.Sub(t0))
	r.received.Add(1)
}

// one sends producer pi's i-th message, started at t0, and times it if t0
// is in the window.
func (r *loopRun) one(ctx context.Context, p *txmq.Producer, pi, i int, t0 time.Time) {
	in := r.w.in(t0)
	body := make([]byte, r.e.o.size)
	if r.kind == "send" {
		binary.BigEndian.PutUint64(body, uint64(t0.UnixNano()))
		if _, err := p.Send(ctx, txmq.Message{Topic: r.topic, Body: body}); err != nil {
			r.errs.Add(1)
			return
		}
		if in {
			r.send.add(time.Since(t0))
			r.committed.Add(1)
		}
		return
	}
	id, err := p.SendHalf(ctx, fmt.Sprintf("%s-%d-%d", r.e.runID, pi, i), txmq.Message{Topic: r.topic, Body: body})
	if err != nil {
		r.errs.Add(1)
		return
	}
	t1 := time.Now()
	if local := r.e.o.localTx; local > 0 {
		select {
		case <-time.After(local):
		case <-ctx.Done():
			return
		}
	}
	tc := time.Now()
	if in {
		r.commitAt.Store(id, tc)
	}
	if err := p.Commit(ctx, id); err != nil {
		r.commitAt.Delete(id)
		r.errs.Add(1)
		return
	}
	if in {
		t2 := time.Now()
		r.half.add(t1.Sub(t0))
		r.commit.add(t2.Sub(tc))
		r.txn.add(t2.Sub(t0))
		r.committed.Add(1)
	}
}

func (r *loopRun) report(res *result) {
	res.Ops, res.Errors = r.committed.Load(), r.errs.Load()
	res.Writes = 2 * res.Ops
	if r.kind == "send" {
		res.Writes = res.Ops
	}
	res.Throughput = float64(res.Ops) / r.e.o.duration.Seconds()
	if r.kind == "send" {
		res.lat("send", "Send", &r.send)
	} else {
		res.lat("half", "SendHalf", &r.half)
		res.lat("commit", "Commit", &r.commit)
		res.lat("txn", "whole transaction", &r.txn)
		if local := r.e.o.localTx; local > 0 {
			res.extra("local_tx_ms", "ms each producer waited between SendHalf and Commit (--local-tx; in the whole transaction)", float64(local)/float64(time.Millisecond))
		}
	}
	res.lat("deliver", "commit called → consumer received", &r.deliver)
	if r.kind == "tx-oneway" {
		res.extra("checks_answered", "check-backs the producers answered during the run (one-way commits lost or not yet applied)", float64(r.checks.Load()))
	}
}

// commitAll is a Checker that answers COMMIT to every check-back and
// counts them.
func commitAll(checks *atomic.Int64) txmq.Checker {
	return func(context.Context, txmq.HalfMessage) (txmq.Resolution, error) {
		checks.Add(1)
		return txmq.Commit, nil
	}
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

	ps, closeProducers, err := e.producers(4, txmq.ProducerConfig{ProducerGroup: group})
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

	admin, closeAdmin, err := adminClients(e.c.addrs(), e.tls, e.token)
	if err != nil {
		return nil, err
	}
	defer closeAdmin()
	var checks atomic.Int64
	e.m.start()
	t0 := time.Now()
	p, err := e.producer(txmq.ProducerConfig{ProducerGroup: group, Checker: commitAll(&checks)})
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

func adminClients(addrs []string, conf *tls.Config, token string) ([]txmqv1.AdminServiceClient, func(), error) {
	var conns []*grpc.ClientConn
	var out []txmqv1.AdminServiceClient
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for _, a := range addrs {
		creds := insecure.NewCredentials()
		if conf != nil {
			creds = credentials.NewTLS(conf)
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		if token != "" {
			opts = append(opts, grpc.WithPerRPCCredentials(txmq.TokenCredentials(token)))
		}
		cc, err := grpc.NewClient(a, opts...)
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
