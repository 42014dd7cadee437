package txmq_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// A handler dead-letters a poison message at once, by returning
// Terminate(err) or by calling Delivery.Term: each is delivered once, the
// DLQ keeps the reason, and the rest of the topic flows on.
func TestBrokerTerminate(t *testing.T) {
	rb := newRealBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{rb.grpcAddr}})
	require.NoError(t, err)
	defer p.Close()
	for _, body := range []string{"returned", "called", "good", "wrapped"} {
		_, err = p.Send(ctx, txmq.Message{Topic: "t", Body: []byte(body)})
		require.NoError(t, err)
	}

	var mu sync.Mutex
	seen := map[string]int{}
	termErrs := make(chan error, 2)
	runConsumer(t, rb.grpcAddr, "t", "g", func(ctx context.Context, d *txmq.Delivery) error {
		mu.Lock()
		seen[string(d.Body)]++
		mu.Unlock()
		switch string(d.Body) {
		case "returned":
			return txmq.Terminate(errors.New("schema v0 is not supported"))
		case "wrapped":
			// Terminate wins over RetryAfter, however they are nested.
			return txmq.RetryAfter(fmt.Errorf("handler: %w", txmq.Terminate(errors.New("bad amount"))), time.Hour)
		case "called":
			termErrs <- d.Term(ctx, "negative quantity")
			// Once terminated, neither a second Term nor the
			// handler's own answer changes anything.
			termErrs <- d.Term(ctx, "again")
			return errors.New("ignored after Term")
		}
		return nil
	})

	admin := rb.admin(t)
	var dead []*txmqv1.DeadLetter
	txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		r, err := admin.ListDeadLetters(ctx, &txmqv1.ListDeadLettersRequest{ConsumerGroup: "g"})
		if err != nil {
			return err
		}
		g, err := admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "g"})
		if err != nil {
			return err
		}
		if len(r.DeadLetters) != 3 || g.Topics[0].Lag != 0 {
			return fmt.Errorf("%d dead letters, lag %d", len(r.DeadLetters), g.Topics[0].Lag)
		}
		dead = r.DeadLetters
		return nil
	})
	reasons := map[uint64]string{}
	for _, dl := range dead {
		require.Equal(t, uint32(1), dl.Attempts)
		reasons[dl.Sequence] = dl.LastError
	}
	require.Equal(t, map[uint64]string{1: "schema v0 is not supported", 2: "negative quantity", 4: "handler: bad amount"}, reasons)
	require.NoError(t, <-termErrs)
	require.ErrorContains(t, <-termErrs, "already acked or nacked")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{"returned": 1, "called": 1, "good": 1, "wrapped": 1}, seen, "nothing is redelivered")
}

// Term of a Delivery that did not come from a Consumer is refused.
func TestDeliveryTermOutsideConsumer(t *testing.T) {
	err := (&txmq.Delivery{MessageID: "m"}).Term(context.Background(), "x")
	require.ErrorIs(t, err, txmq.ErrInvalidArgument)
}
