package broker

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// TestAuthConnsPerPrincipal: order, at its limit of 2 connections, is
// refused on a third while billing is not; once one of order's closes, a
// call on the third gets in. /metrics shows each principal's count.
func TestAuthConnsPerPrincipal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeAuthFile(t, path, testPrincipals, testRules)
	tb := startBroker(t, func(c *Config) {
		c.AuthFile = path
		c.Limits.Conns = 2
		c.MetricsAddr = "127.0.0.1:0"
	})
	// Each client connection is one TCP connection to the broker.
	dial := func() txmqv1.ProducerServiceClient {
		cc, err := grpc.NewClient(tb.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return txmqv1.NewProducerServiceClient(cc)
	}
	send := func(c txmqv1.ProducerServiceClient, who, topic string) error {
		_, err := c.Send(as(t, who), &txmqv1.SendRequest{Topic: topic, Body: []byte("x")})
		return err
	}
	first, err := grpc.NewClient(tb.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	require.NoError(t, send(txmqv1.NewProducerServiceClient(first), "order", "orders"))
	second := dial()
	require.NoError(t, send(second, "order", "orders"))
	// Calls on a connection already counted are not counted again.
	require.NoError(t, send(second, "order", "orders"))

	third := dial()
	err = send(third, "order", "orders")
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	require.ErrorContains(t, err, `principal "order" has 2 connections open, its limit`)
	// Streams are refused on it too.
	err = sessionCall(as(t, "order"), &testBroker{producer: third}, &txmqv1.SessionRequest{Id: 1, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")}}})
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	// Another principal is not held back, on a new connection or on one
	// of order's.
	require.NoError(t, send(dial(), "billing", "bills"))
	require.NoError(t, send(second, "billing", "bills"))

	fams := scrape(t, tb)
	for who, want := range map[string]float64{"order": 2, "billing": 2} {
		v, ok := sample(fams, "txmq_principal_connections", "principal", who)
		require.True(t, ok, "no txmq_principal_connections for %s", who)
		require.Equal(t, want, v, who)
	}
	v, _ := sample(fams, "txmq_limit_refusals_total", "limit", "connections")
	require.GreaterOrEqual(t, v, 2.0)
	v, _ = sample(fams, "txmq_limit", "limit", "connections")
	require.Equal(t, 2.0, v)

	require.NoError(t, first.Close())
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error { return send(third, "order", "orders") })
	// The freed place is taken: a fourth is refused again.
	err = send(dial(), "order", "orders")
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	v, _ = sample(scrape(t, tb), "txmq_principal_connections", "principal", "order")
	require.Equal(t, 2.0, v)
}

// TestAuthConnsLimitFromFile: a principal's own connections limit in the
// auth file replaces the default, and a reload applies a new one to a
// principal with connections open.
func TestAuthConnsLimitFromFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeAuthFileLimits(t, path, testPrincipals, map[string]string{"order": "connections: 2"}, testRules)
	tb := startBroker(t, func(c *Config) { c.AuthFile = path })
	send := func(c txmqv1.ProducerServiceClient) error {
		_, err := c.Send(as(t, "order"), &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")})
		return err
	}
	dial := func() txmqv1.ProducerServiceClient {
		cc, err := grpc.NewClient(tb.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { cc.Close() })
		return txmqv1.NewProducerServiceClient(cc)
	}
	require.NoError(t, send(tb.producer))
	require.NoError(t, send(dial()))
	err := send(dial())
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)

	writeAuthFileLimits(t, path, testPrincipals, map[string]string{"order": "connections: 3"}, testRules)
	require.NoError(t, tb.ReloadAuth())
	require.NoError(t, send(dial()))
	err = send(dial())
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	require.ErrorContains(t, err, `principal "order" has 3 connections open, its limit`)
	require.NoError(t, send(tb.producer))
}
