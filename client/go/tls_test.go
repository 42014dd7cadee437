package txmq_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// ProducerConfig.TLS and ConsumerConfig.TLS against a broker that
// requires client certificates: a transaction commits and is delivered;
// a producer without the TLS settings is not served.
func TestBrokerOverTLS(t *testing.T) {
	ca := txmqtest.NewCA(t, "txmq")
	addr := newBrokers(t, 1, func(cfg *broker.Config) {
		cfg.TLS = ca.Source("broker").ServerConfig(tls.RequireAndVerifyClientCert)
	}).Leader().Addr()
	conf := ca.Client("shop")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{addr}, ProducerGroup: "shop", TLS: conf})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.SendInTransaction(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")},
		func(context.Context) error { return nil })
	require.NoError(t, err)

	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{addr}, Topic: "orders", Group: "points", TLS: ca.Client("points")})
	require.NoError(t, err)
	defer c.Close()
	var got received
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, got.handler) }()
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, got.atLeast(1))
	stop()
	require.NoError(t, <-done)
	require.Equal(t, []string{"paid"}, got.bodies())

	plain, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{addr}, RetryTimeout: time.Second})
	require.NoError(t, err)
	defer plain.Close()
	_, err = plain.Send(ctx, txmq.Message{Topic: "orders", Body: []byte("plaintext")})
	require.ErrorIs(t, err, txmq.ErrUnavailable)
}
