package txmq

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A broker that is down never holds up start-up beyond what the caller
// allows: NewProducerContext returns once ctx is cancelled, with ctx's
// error, and within ctx's deadline, with a producer that goes on
// registering in the background; NewConsumer does not connect at all. The
// package's goleak check (TestMain) shows that nothing is left running.
func TestStartWithBrokerDown(t *testing.T) {
	addr := deadAddr(t)
	checker := func(context.Context, HalfMessage) (Resolution, error) { return Unknown, nil }
	cfg := ProducerConfig{Addrs: []string{addr}, ProducerGroup: "shop", Checker: checker, RetryTimeout: time.Minute}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	p, err := NewProducerContext(ctx, cfg)
	require.ErrorIs(t, err, context.Canceled)
	require.Nil(t, p)
	require.Less(t, time.Since(start), 10*time.Second, "returned long after the cancel, not before RetryTimeout")

	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start = time.Now()
	p, err = NewProducerContext(ctx, cfg)
	require.NoError(t, err, "a deadline that passes leaves the producer registering in the background")
	require.Less(t, time.Since(start), 10*time.Second)
	require.NoError(t, p.Close())

	start = time.Now()
	c, err := NewConsumer(ConsumerConfig{Addrs: []string{addr}, Topic: "t", Group: "g"})
	require.NoError(t, err)
	require.Less(t, time.Since(start), 2*time.Second)
	require.NoError(t, c.Close())
}
