package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	txmq "github.com/txmq/txmq/client/go"
)

const (
	topic         = "chaos"
	producerGroup = "chaos-producers"
)

// groups are the consumer groups: g-fast acks at once (nacking a few), g-slow
// takes its time (and nacks a few too). Both see ordering keys.
var groups = []string{"g-fast", "g-slow"}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// Workload runs producers and consumers against a cluster and records
// every operation in a history. truth is the "local database": the outcome
// of each transaction, which the producers' checker answers from.
type Workload struct {
	addrs     []string
	producers int
	hist      *History

	mu    sync.Mutex
	truth map[string]string // tx ID → outcome

	prods []*txmq.Producer
	cons  []*txmq.Consumer
	stop  context.CancelFunc // stops the producers' loops
	wg    sync.WaitGroup     // the producers' loops
	cwg   sync.WaitGroup     // the consumers' runs
}

// NewWorkload connects producers (with checkers) and consumers.
func NewWorkload(addrs []string, producers int, hist *History) (*Workload, error) {
	w := &Workload{addrs: addrs, producers: producers, hist: hist, truth: map[string]string{}}
	for i := range producers {
		p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: addrs, ProducerGroup: producerGroup,
			Checker: w.check, InstanceID: fmt.Sprint("chaos-", i), RetryTimeout: 10 * time.Second, Logger: quiet})
		if err != nil {
			w.Close()
			return nil, err
		}
		w.prods = append(w.prods, p)
	}
	for _, g := range groups {
		for range 2 {
			c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: addrs, Topic: topic, Group: g,
				Concurrency: 4, Prefetch: 16, Logger: quiet, ReconnectBackoff: 500 * time.Millisecond})
			if err != nil {
				w.Close()
				return nil, err
			}
			w.cons = append(w.cons, c)
		}
	}
	return w, nil
}

// check answers a check-back from the truth: unknown while the local
// transaction has no outcome yet.
func (w *Workload) check(_ context.Context, m txmq.HalfMessage) (txmq.Resolution, error) {
	w.mu.Lock()
	outcome, ok := w.truth[m.TransactionID]
	w.mu.Unlock()
	switch {
	case !ok:
		return txmq.Unknown, nil
	case committedInTruth(outcome):
		w.hist.Add(Event{Kind: evCheck, TxID: m.TransactionID, MsgID: m.MessageID, Outcome: txCommit})
		return txmq.Commit, nil
	default:
		w.hist.Add(Event{Kind: evCheck, TxID: m.TransactionID, MsgID: m.MessageID, Outcome: txRollback})
		return txmq.Rollback, nil
	}
}

func (w *Workload) decide(txID, outcome string) {
	w.mu.Lock()
	w.truth[txID] = outcome
	w.mu.Unlock()
}

// Start starts the consumers and the producers' loops.
func (w *Workload) Start() {
	for i, c := range w.cons {
		h := w.handler(groups[i/2])
		w.cwg.Go(func() {
			if err := c.Run(context.Background(), h); err != nil && !errors.Is(err, txmq.ErrClosed) {
				w.hist.Add(Event{Kind: "consumer-error", Err: err.Error()})
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.stop = cancel
	for i, p := range w.prods {
		w.wg.Go(func() { w.produce(ctx, i, p) })
	}
}

// StopProducing ends the producers' loops; their checkers keep answering.
func (w *Workload) StopProducing() {
	if w.stop != nil {
		w.stop()
	}
	w.wg.Wait()
}

// Close stops everything.
func (w *Workload) Close() {
	w.StopProducing()
	for _, c := range w.cons {
		c.Close()
	}
	w.cwg.Wait()
	for _, p := range w.prods {
		p.Close()
	}
}

func (w *Workload) produce(ctx context.Context, i int, p *txmq.Producer) {
	for n := 0; ctx.Err() == nil; n++ {
		var okey string
		if rand.IntN(2) == 0 {
			okey = fmt.Sprint("k", rand.IntN(8))
		}
		if rand.IntN(100) < 15 {
			w.send(ctx, p, fmt.Sprintf("send-%d-%d", i, n), okey)
		} else {
			w.transact(ctx, p, fmt.Sprintf("tx-%d-%d", i, n), okey)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// transact runs one transaction: a half message, the local transaction
// (its outcome recorded in the truth first), then Commit, Rollback, or
// nothing (a crash between the two, left to check-back).
func (w *Workload) transact(ctx context.Context, p *txmq.Producer, txID, okey string) {
	e := Event{T: time.Now(), Kind: evTx, TxID: txID, OrderingKey: okey}
	msg := txmq.Message{Topic: topic, OrderingKey: okey, Body: []byte(txID)}
	id, err := p.SendHalf(ctx, txID, msg, txmq.WithCheckAfter(time.Second))
	e.MsgID = id
	if err != nil {
		w.decide(txID, txAborted)
		e.Outcome, e.Err, e.End = txAborted, err.Error(), time.Now()
		w.hist.Add(e)
		return
	}
	r := rand.IntN(100)
	switch {
	case r < 75:
		e.Outcome = txCommit
	case r < 85:
		e.Outcome = txRollback
	case r < 93:
		e.Outcome = txCrashCommit
	default:
		e.Outcome = txCrashRollback
	}
	w.decide(txID, e.Outcome)
	e.Mid = time.Now()
	switch e.Outcome {
	case txCommit:
		err = p.Commit(ctx, id)
	case txRollback:
		err = p.Rollback(ctx, id)
	}
	e.End = time.Now()
	e.OK = err == nil
	if err != nil {
		e.Err = err.Error()
	}
	w.hist.Add(e)
}

// send sends a plain message under key, repeating the same key after an
// error (the broker deduplicates it) up to three times.
func (w *Workload) send(ctx context.Context, p *txmq.Producer, key, okey string) {
	e := Event{T: time.Now(), Kind: evSend, Key: key, OrderingKey: okey}
	var err error
	for try := 0; try < 3 && ctx.Err() == nil; try++ {
		var res txmq.SendResult
		res, err = p.Send(ctx, txmq.Message{Topic: topic, Key: key, OrderingKey: okey, Body: []byte(key)})
		if err == nil {
			e.MsgID, e.OK = res.MessageID, true
			break
		}
	}
	if err != nil {
		e.Err = err.Error()
	}
	e.End = time.Now()
	w.hist.Add(e)
}

// handler records each delivery: g-fast acks at once, g-slow takes up to
// 30 ms; both nack one delivery in 20 (the message comes again).
func (w *Workload) handler(group string) txmq.Handler {
	return func(ctx context.Context, d *txmq.Delivery) error {
		e := Event{T: time.Now(), Kind: evDeliver, Group: group, MsgID: d.MessageID, TxID: d.TransactionID,
			Key: d.Key, Seq: d.Sequence, OrderingKey: d.OrderingKey, Attempt: d.Attempt}
		if group == "g-slow" {
			time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond)
		}
		var err error
		if rand.IntN(20) == 0 {
			err = txmq.RetryAfter(errors.New("chaos: nacked on purpose"), 100*time.Millisecond)
		}
		e.End, e.OK = time.Now(), err == nil
		w.hist.Add(e)
		return err
	}
}
