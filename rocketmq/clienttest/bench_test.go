package clienttest

import (
	"bytes"
	"context"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"
)

// The RocketMQ client against one in-process txmq node (BenchmarkCluster:
// three broker processes): 256-byte bodies,
// 16 goroutines per GOMAXPROCS sharing one client, and the rate in
// messages per second.

func BenchmarkSendSync(b *testing.B) {
	e := newEnv(b)
	p := e.producer(e.name("bench"))
	body := bytes.Repeat([]byte("x"), 256)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := p.SendSync(context.Background(), primitive.NewMessage("bench", body))
			require.NoError(b, err)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// A transaction: the half message, the listener's COMMIT, END_TRANSACTION.
// END_TRANSACTION is one-way, so the rate counts half messages stored.
func BenchmarkTransaction(b *testing.B) {
	e := newEnv(b)
	p, err := producer.NewTransactionProducer(byBody{}, e.producerOpts(e.name("bench-tx"))...)
	require.NoError(b, err)
	require.NoError(b, p.Start())
	b.Cleanup(func() { p.Shutdown() })
	body := append([]byte("tx-commit-"), bytes.Repeat([]byte("x"), 246)...)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := p.SendMessageInTransaction(context.Background(), primitive.NewMessage("bench-tx", body))
			require.NoError(b, err)
			require.Equal(b, primitive.CommitMessageState, r.State)
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}
