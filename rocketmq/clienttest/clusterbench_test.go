package clienttest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	txmq "github.com/txmq/txmq/client/go"
)

// BenchmarkCluster measures in the terms of make bench (docs/benchmarks.md):
// three cmd/broker processes on 127.0.0.1, 1 and 16 producers each with a
// client of its own in a closed loop, 256-byte bodies, 10 s measured after
// 2 s of warm-up, ops/s and p50/p99 of the calls started in the window.
// The RocketMQ client's SendSync and SendMessageInTransaction (listener
// COMMIT), and txmq's Go client's Send and SendHalf+Commit, one after the
// other against the same cluster. It runs once whatever b.N, and prints a
// table: go test -run '^$' -bench Cluster -benchtime 1x.
func BenchmarkCluster(b *testing.B) {
	pc := startProcCluster(b)
	pc.leader()
	fmt.Printf("load average before: %s", loadAvg())
	fmt.Println("| client | workload | producers | ops/s | p50 ms | p99 ms | errors |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	for _, n := range []int{1, 16} {
		for _, w := range clusterWorkloads {
			r := w.run(b, pc, fmt.Sprintf("%s-%d", w.topic, n), n)
			fmt.Printf("| %s | %s | %d | %.0f | %.2f | %.2f | %d |\n", w.client, w.name, n, r.rate, ms(r.p50), ms(r.p99), r.errs)
		}
	}
	fmt.Printf("load average after: %s", loadAvg())
}

// clusterWorkloads are the runs of BenchmarkCluster, for each number of
// producers.
var clusterWorkloads = []struct {
	client, name, topic string
	run                 func(b *testing.B, pc *procCluster, topic string, n int) measured
}{
	{"rocketmq-client-go", "SendSync", "rmq-send", rocketmqSend},
	{"txmq Go client", "Send", "txmq-send", txmqSend},
	{"rocketmq-client-go", "SendMessageInTransaction (COMMIT)", "rmq-tx", rocketmqTx},
	{"txmq Go client", "SendHalf + Commit", "txmq-tx", txmqTx},
}

const (
	benchWarmup   = 2 * time.Second
	benchDuration = 10 * time.Second
)

type measured struct {
	rate     float64
	p50, p99 time.Duration
	errs     int64
}

// measure runs op on n workers in a closed loop for the warm-up and the
// measured window, and times the calls started in the window.
func measure(n int, op func(worker, i int) error) measured {
	from := time.Now().Add(benchWarmup)
	to := from.Add(benchDuration)
	lat := make([][]time.Duration, n)
	var errs atomic.Int64
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				t0 := time.Now()
				if !t0.Before(to) {
					return
				}
				if err := op(w, i); err != nil {
					errs.Add(1)
					continue
				}
				if !t0.Before(from) {
					lat[w] = append(lat[w], time.Since(t0))
				}
			}
		})
	}
	wg.Wait()
	all := slices.Concat(lat...)
	slices.Sort(all)
	m := measured{rate: float64(len(all)) / benchDuration.Seconds(), errs: errs.Load()}
	if len(all) > 0 {
		m.p50, m.p99 = all[len(all)*50/100], all[len(all)*99/100]
	}
	return m
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown\n"
	}
	return string(b)
}

// rocketmqProducers starts n RocketMQ producers, each its own client
// (instance), of a group named after topic, shut down when the run ends.
func rocketmqProducers[P interface {
	Start() error
	Shutdown() error
}](b *testing.B, pc *procCluster, topic string, n int, open func(...producer.Option) (P, error)) ([]P, func()) {
	var ps []P
	stop := func() {
		for _, p := range ps {
			p.Shutdown()
		}
	}
	for i := range n {
		name := fmt.Sprintf("%s-%d", topic, i)
		p, err := open(producer.WithNameServer(pc.names()), producer.WithGroupName(topic),
			producer.WithInstanceName(name), producer.WithRetry(2), producer.WithSendMsgTimeout(5*time.Second))
		if err == nil {
			err = p.Start()
		}
		if err != nil {
			stop()
		}
		require.NoError(b, err)
		ps = append(ps, p)
	}
	return ps, stop
}

func rocketmqSend(b *testing.B, pc *procCluster, topic string, n int) measured {
	ps, stop := rocketmqProducers(b, pc, topic, n, func(o ...producer.Option) (rmqProducer, error) { return producer.NewDefaultProducer(o...) })
	defer stop()
	body := bytes.Repeat([]byte("x"), 256)
	return measure(n, func(w, _ int) error {
		_, err := ps[w].SendSync(context.Background(), primitive.NewMessage(topic, body))
		return err
	})
}

func rocketmqTx(b *testing.B, pc *procCluster, topic string, n int) measured {
	ps, stop := rocketmqProducers(b, pc, topic, n, func(o ...producer.Option) (rocketmqTxProducer, error) {
		return producer.NewTransactionProducer(byBody{}, o...)
	})
	defer stop()
	body := append([]byte("tx-commit-"), bytes.Repeat([]byte("x"), 246)...)
	return measure(n, func(w, _ int) error {
		r, err := ps[w].SendMessageInTransaction(context.Background(), primitive.NewMessage(topic, body))
		if err == nil && r.State != primitive.CommitMessageState {
			err = fmt.Errorf("transaction state %d, not COMMIT", r.State)
		}
		return err
	})
}

type rmqProducer interface {
	rocketmqProducer
	Start() error
	Shutdown() error
}

type rocketmqTxProducer interface {
	SendMessageInTransaction(context.Context, *primitive.Message) (*primitive.TransactionSendResult, error)
	Start() error
	Shutdown() error
}

// txmqProducers starts n producers of txmq's Go client, each with its
// own connection, of a group named after topic, closed when the run ends.
func txmqProducers(b *testing.B, pc *procCluster, topic string, n int) ([]*txmq.Producer, func()) {
	var ps []*txmq.Producer
	stop := func() {
		for _, p := range ps {
			p.Close()
		}
	}
	for range n {
		p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: pc.apis(), ProducerGroup: topic, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			stop()
		}
		require.NoError(b, err)
		ps = append(ps, p)
	}
	return ps, stop
}

func txmqSend(b *testing.B, pc *procCluster, topic string, n int) measured {
	ps, stop := txmqProducers(b, pc, topic, n)
	defer stop()
	body := bytes.Repeat([]byte("x"), 256)
	return measure(n, func(w, _ int) error {
		_, err := ps[w].Send(context.Background(), txmq.Message{Topic: topic, Body: body})
		return err
	})
}

func txmqTx(b *testing.B, pc *procCluster, topic string, n int) measured {
	ps, stop := txmqProducers(b, pc, topic, n)
	defer stop()
	body := bytes.Repeat([]byte("x"), 256)
	return measure(n, func(w, i int) error {
		id, err := ps[w].SendHalf(context.Background(), fmt.Sprintf("%s-%d-%d", topic, w, i), txmq.Message{Topic: topic, Body: body})
		if err != nil {
			return err
		}
		return ps[w].Commit(context.Background(), id)
	})
}
