package txmq_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// With auto-create off, a consumer of a misspelt topic or group stops at
// once with ErrNotFound and a hint, creating nothing; once an operator
// created the group, the consumer runs and shows as a member under its
// client ID.
func TestBrokerConsumerCreatesNothingWithoutAutoCreate(t *testing.T) {
	off := false
	addr := newBrokers(t, 1, func(cfg *broker.Config) { cfg.AutoCreateTopics = &off }).Leader().Addr()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	admin := txmqv1.NewAdminServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = admin.CreateTopic(ctx, &txmqv1.CreateTopicRequest{Name: "orders"})
	require.NoError(t, err)

	handler := func(context.Context, *txmq.Delivery) error { return nil }
	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{addr}, Topic: "orders", Group: "points", ClientID: "points-1"})
	require.NoError(t, err)
	defer c.Close()
	err = c.Run(ctx, handler)
	require.ErrorIs(t, err, txmq.ErrNotFound)
	require.ErrorContains(t, err, "brokerctl group create points --topic orders")

	_, err = admin.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "points", Topic: "orders"})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, handler) }()
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		d, err := admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"})
		if err != nil {
			return err
		}
		if len(d.Members) != 1 || d.Members[0].ClientId != "points-1" {
			return fmt.Errorf("members %v", d.Members)
		}
		return nil
	})
	stop()
	require.NoError(t, <-done)

	_, err = txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{addr}, Topic: "orders", Group: "points", ClientID: string(make([]byte, 257))})
	require.ErrorIs(t, err, txmq.ErrInvalidArgument)
}
