package broker

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// A transaction ID or a Send key names one message: an identical repeat is
// a duplicate returning the first ID; a repeat with another topic or body
// is refused with FailedPrecondition naming the first message, and stores
// nothing; properties are not compared.
func TestRepeatWithAnotherMessageRefused(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	first := sendHalf(t, tb, "orders", "shop", "order-1:paid", "paid 10")
	again, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "order-1:paid",
		Body: []byte("paid 10"), Properties: map[string]string{"traceparent": "a new one"}})
	require.NoError(t, err)
	require.True(t, again.Duplicate)
	require.Equal(t, first, again.MessageId)

	for _, req := range []*txmqv1.SendHalfRequest{
		{Topic: "orders", ProducerGroup: "shop", TransactionId: "order-1:paid", Body: []byte("paid 11")},
		{Topic: "refunds", ProducerGroup: "shop", TransactionId: "order-1:paid", Body: []byte("paid 10")},
	} {
		_, err := tb.producer.SendHalf(ctx, req)
		require.Equal(t, codes.FailedPrecondition, codeOf(err), "%v", err)
		require.Contains(t, err.Error(), `transaction ID "order-1:paid" of producer group shop is message `+first)
	}
	_, err = end(tb, ctx, first, txmqv1.Resolution_RESOLUTION_COMMIT)
	require.NoError(t, err)
	_, err = tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "order-1:paid", Body: []byte("paid 11")})
	require.Equal(t, codes.FailedPrecondition, codeOf(err), "still refused once committed: %v", err)

	a, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "audit", Key: "k1", Body: []byte("x")})
	require.NoError(t, err)
	b, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "audit", Key: "k1", Body: []byte("x"), Properties: map[string]string{"attempt": "2"}})
	require.NoError(t, err)
	require.True(t, b.Duplicate)
	require.Equal(t, a.MessageId, b.MessageId)
	_, err = tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "audit", Key: "k1", Body: []byte("y")})
	require.Equal(t, codes.FailedPrecondition, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), `key "k1" was sent on topic audit as message `+a.MessageId+" (sequence 1) with another body")

	sub := subscribe(t, tb, "audit", "g", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.Equal(t, "x", string(d.Body))
	require.Nil(t, sub.next(200*time.Millisecond), "the refused repeat stored nothing")
}
