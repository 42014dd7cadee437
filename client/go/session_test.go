package txmq_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
)

// metricsBroker is a single-node broker that serves /metrics.
func metricsBroker(t *testing.T) (*broker.Broker, string) {
	t.Helper()
	b := newBrokers(t, 1, func(cfg *broker.Config) { cfg.MetricsAddr = "127.0.0.1:0" }).Leader()
	return b, "http://" + b.MetricsAddr() + "/metrics"
}

// calls counts the OK calls of a method from a scrape.
func calls(t *testing.T, url, method string) int {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	prefix := fmt.Sprintf(`txmq_grpc_requests_total{code="OK",method="%s"} `, method)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, prefix); ok {
			var n int
			_, err := fmt.Sscan(rest, &n)
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// A producer's writes go on its session, many in flight at once, not as
// one call each.
func TestBrokerProducerWritesOnItsSession(t *testing.T) {
	b, metrics := metricsBroker(t)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{b.Addr()}, ProducerGroup: "shop"})
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := p.SendHalf(ctx, fmt.Sprint("tx", i), txmq.Message{Topic: "orders", Body: []byte("x")})
			if err == nil {
				err = p.Commit(ctx, id)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	_, err = p.Send(ctx, txmq.Message{Topic: "orders", Key: "k", Body: []byte("plain")})
	require.NoError(t, err)
	require.Equal(t, n, calls(t, metrics, "/txmq.v1.ProducerService/Session:SendHalf"))
	require.Equal(t, n, calls(t, metrics, "/txmq.v1.ProducerService/Session:EndTransaction"))
	require.Equal(t, 1, calls(t, metrics, "/txmq.v1.ProducerService/Session:Send"))
	require.Zero(t, calls(t, metrics, "/txmq.v1.ProducerService/SendHalf"), "no unary calls")
}

// A session that the broker's restart breaks is opened again; the writes
// in flight are retried when they are safe to repeat.
func TestBrokerSessionSurvivesRestart(t *testing.T) {
	rb := newRealBroker(t)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop"})
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	first, err := p.SendHalf(ctx, "tx1", txmq.Message{Topic: "orders", Body: []byte("1")})
	require.NoError(t, err)
	rb.restart()
	require.NoError(t, p.Commit(ctx, first))
	second, err := p.SendHalf(ctx, "tx1", txmq.Message{Topic: "orders", Body: []byte("1")})
	require.NoError(t, err)
	require.Equal(t, first, second, "the same transaction after the restart")
}

// A one-way commit returns once it is sent and is applied behind; it needs
// a Checker, which recovers a commit that is lost.
func TestBrokerOnewayCommit(t *testing.T) {
	rb := newRealBroker(t)
	_, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop", OnewayCommit: true})
	require.ErrorIs(t, err, txmq.ErrInvalidArgument)
	require.ErrorContains(t, err, "Checker")

	commitAll := func(context.Context, txmq.HalfMessage) (txmq.Resolution, error) { return txmq.Commit, nil }
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop", OnewayCommit: true, Checker: commitAll})
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	id, err := p.SendInTransaction(ctx, "tx1", txmq.Message{Topic: "orders", Body: []byte("paid")}, func(context.Context) error { return nil })
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rb.halfState(id).String() == "HALF_STATE_COMMITTED" }, 10*time.Second, 10*time.Millisecond)
	// Rollbacks stay acknowledged.
	other, err := p.SendHalf(ctx, "tx2", txmq.Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, p.Commit(ctx, other))
	require.Eventually(t, func() bool { return rb.halfState(other).String() == "HALF_STATE_COMMITTED" }, 10*time.Second, 10*time.Millisecond)
	require.ErrorIs(t, p.Rollback(ctx, other), txmq.ErrConflict, "a rollback waits for its answer")
}
