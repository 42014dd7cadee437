package dbtest

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

var quiet = txmqtest.Logger()

// realBroker is a single-node broker of the harness (txmqtest), at the
// same address across restarts.
type realBroker struct {
	t        *testing.T
	c        *txmqtest.Cluster[*broker.Broker]
	grpcAddr string
	admin    txmqv1.AdminServiceClient
}

func newRealBroker(t *testing.T) *realBroker {
	c := txmqtest.NewCluster(t, 1, func(s txmqtest.Spec) (*broker.Broker, error) {
		return broker.Open(broker.Config{
			Raft: s.Raft, GRPCListener: s.API, Logger: quiet,
			// Short heartbeats so that producers find a restarted broker
			// fast; a short check backoff so that an UNKNOWN answer is
			// asked again within the test's patience.
			CheckBack: checkback.Config{HeartbeatInterval: 100 * time.Millisecond, Lease: time.Second},
		})
	})
	rb := &realBroker{t: t, c: c, grpcAddr: c.Leader().Addr()}
	conn, err := grpc.NewClient(rb.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	rb.admin = txmqv1.NewAdminServiceClient(conn)
	t.Cleanup(func() { conn.Close() })
	return rb
}

// start starts the stopped broker again and waits until it leads.
func (rb *realBroker) start() {
	rb.t.Helper()
	rb.c.Start("n1")
	rb.c.Leader()
}

// stop closes the broker; its address then refuses connections.
func (rb *realBroker) stop() {
	rb.t.Helper()
	rb.c.Stop("n1")
}

func (rb *realBroker) halfState(id string) txmqv1.HalfState {
	rb.t.Helper()
	r, err := rb.admin.GetHalfMessage(context.Background(), &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(rb.t, err)
	return r.GetMessage().GetState()
}

// topicMessages is how many messages the topic holds, 0 for a topic that
// does not exist yet.
func (rb *realBroker) topicMessages(topic string) uint64 {
	rb.t.Helper()
	r, err := rb.admin.ListTopics(context.Background(), &txmqv1.ListTopicsRequest{})
	require.NoError(rb.t, err)
	for _, tp := range r.GetTopics() {
		if tp.GetName() == topic {
			return tp.GetMessages()
		}
	}
	return 0
}

func grpcInsecure() grpc.DialOption {
	return grpc.WithTransportCredentials(insecure.NewCredentials())
}

func (rb *realBroker) producer(t *testing.T, cfg txmq.ProducerConfig) *txmq.Producer {
	t.Helper()
	cfg.Addrs = []string{rb.grpcAddr}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	p, err := txmq.NewProducer(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// deliveries collects what a consumer of the topic receives until the test
// ends.
type deliveries struct {
	mu   sync.Mutex
	msgs []*txmq.Delivery
}

func (d *deliveries) all() []*txmq.Delivery {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*txmq.Delivery(nil), d.msgs...)
}

func (rb *realBroker) consume(t *testing.T, topic, group string) *deliveries {
	t.Helper()
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{rb.grpcAddr}, Topic: topic, Group: group, Logger: quiet})
	require.NoError(t, err)
	got := &deliveries{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Run(ctx, func(ctx context.Context, d *txmq.Delivery) error {
			got.mu.Lock()
			defer got.mu.Unlock()
			got.msgs = append(got.msgs, d)
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		c.Close()
	})
	return got
}
