package txmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	txmq "github.com/txmq/txmq/client/go"
)

// Through the producer's session, against a real broker: an identical
// repeat of a key or transaction ID is a duplicate with the first ID; a
// repeat with another body fails with ErrConflict naming the first
// message, and SendInTransaction then runs no local transaction.
func TestBrokerRepeatWithAnotherMessage(t *testing.T) {
	rb := newRealBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}, ProducerGroup: "shop"})
	require.NoError(t, err)
	defer p.Close()

	first, err := p.Send(ctx, txmq.Message{Topic: "orders", Key: "order-1:shipped", Body: []byte("shipped")})
	require.NoError(t, err)
	again, err := p.Send(ctx, txmq.Message{Topic: "orders", Key: "order-1:shipped", Body: []byte("shipped"),
		Properties: map[string]string{"attempt": "2"}})
	require.NoError(t, err)
	require.Equal(t, txmq.SendResult{MessageID: first.MessageID, Sequence: first.Sequence, Duplicate: true}, again)
	_, err = p.Send(ctx, txmq.Message{Topic: "orders", Key: "order-1:shipped", Body: []byte("shipped at noon")})
	require.ErrorIs(t, err, txmq.ErrConflict)
	require.ErrorContains(t, err, "as message "+first.MessageID)

	id, err := p.SendHalf(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")})
	require.NoError(t, err)
	dup, err := p.SendHalf(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")})
	require.NoError(t, err)
	require.Equal(t, id, dup)
	ran := false
	_, err = p.SendInTransaction(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid twice")},
		func(context.Context) error { ran = true; return nil })
	require.ErrorIs(t, err, txmq.ErrConflict)
	require.ErrorContains(t, err, "is message "+id)
	require.False(t, ran, "no local transaction for a refused half message")
}
