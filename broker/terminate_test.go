package broker

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// terminate sends a terminating nack: to the DLQ at once.
func (s *subscription) terminate(reason string, ids ...string) {
	s.t.Helper()
	n := &txmqv1.NackRequest{MessageIds: ids, Error: reason, Terminate: true}
	require.NoError(s.t, s.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: n}}))
}

// deadLetters lists a group's dead letters.
func deadLetters(t *testing.T, tb *testBroker, group string) []*txmqv1.DeadLetter {
	t.Helper()
	r, err := tb.admin.ListDeadLetters(ctxT(t), &txmqv1.ListDeadLettersRequest{ConsumerGroup: group})
	require.NoError(t, err)
	return r.DeadLetters
}

// A terminated delivery goes to the DLQ on its first attempt, with the
// consumer's reason as its last error, although the group allows 16.
func TestTerminateDeadLettersAtOnce(t *testing.T) {
	tb := startBroker(t, nil)
	ids := sendN(t, tb, "t", 3, nil)
	sub := subscribe(t, tb, "t", "g", 10)
	got := map[string]int{}
	for range 3 {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		got[d.MessageId]++
		switch d.MessageId {
		case ids[0]:
			sub.terminate("unparseable JSON at byte 3", d.MessageId)
		case ids[1]:
			sub.terminate("", d.MessageId)
		default:
			sub.ack(d.MessageId)
		}
	}
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := len(deadLetters(t, tb, "g")); n != 2 {
			return fmt.Errorf("%d dead letters, want 2", n)
		}
		return nil
	})
	reasons := map[string]string{}
	for _, dl := range deadLetters(t, tb, "g") {
		require.Equal(t, uint32(1), dl.Attempts, "dead-lettered on its first attempt")
		reasons[dl.MessageId] = dl.LastError
	}
	require.Equal(t, "unparseable JSON at byte 3", reasons[ids[0]])
	require.Equal(t, "terminated by the consumer", reasons[ids[1]], "a terminate without a reason says so")
	require.Nil(t, sub.next(300*time.Millisecond), "a terminated message is not redelivered")
	st := describe(t, tb, "g").Topics[0]
	require.Equal(t, uint64(3), st.AckedThrough, "dead letters count as done")
	require.Equal(t, map[string]int{ids[0]: 1, ids[1]: 1, ids[2]: 1}, got)
}

// With ordering keys, a terminated message is a poison message: the rest
// of its key goes on (skip) or waits for the operator (hold).
func TestTerminateOrderedPoison(t *testing.T) {
	for _, hold := range []bool{false, true} {
		t.Run(fmt.Sprintf("hold=%v", hold), func(t *testing.T) {
			tb := startBroker(t, nil)
			ctx := ctxT(t)
			if hold {
				_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{
					ConsumerGroup: "g", OrderedPoison: txmqv1.OrderedPoison_ORDERED_POISON_HOLD,
				}})
				require.NoError(t, err)
			}
			for _, m := range []struct{ key, body string }{{"a", "a1"}, {"a", "a2"}, {"b", "b1"}} {
				_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte(m.body), OrderingKey: m.key})
				require.NoError(t, err)
			}
			sub := subscribe(t, tb, "t", "g", 10)
			got := map[string]int{}
			for {
				d := sub.next(time.Second)
				if d == nil {
					break
				}
				got[string(d.Body)]++
				if string(d.Body) == "a1" {
					sub.terminate("poison", d.MessageId)
					continue
				}
				sub.ack(d.MessageId)
			}
			require.Equal(t, 1, got["a1"], "a1 is tried once")
			require.Equal(t, 1, got["b1"], "another key is not blocked")
			require.Equal(t, uint64(1), describe(t, tb, "g").Topics[0].DeadLetters)
			if hold {
				require.Zero(t, got["a2"], "hold: the rest of the key waits")
			} else {
				require.Equal(t, 1, got["a2"], "skip: the key goes on after its dead letter")
			}
		})
	}
}

// A terminate with a delay is refused: the stream ends with
// InvalidArgument, and the delivery is not lost but redelivered.
func TestTerminateWithDelayRefused(t *testing.T) {
	tb := startBroker(t, nil)
	ids := sendN(t, tb, "t", 1, nil)
	sub := subscribe(t, tb, "t", "g", 10)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	n := &txmqv1.NackRequest{MessageIds: ids, Error: "x", Terminate: true, Delay: durationpb.New(time.Second)}
	require.NoError(t, sub.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: n}}))
	err := sub.waitEnd(5 * time.Second)
	require.Equal(t, codes.InvalidArgument, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), "takes no delay")
	require.Empty(t, deadLetters(t, tb, "g"))

	again := subscribe(t, tb, "t", "g", 10)
	d = again.next(5 * time.Second)
	require.NotNil(t, d, "the message comes again")
	require.Equal(t, ids[0], d.MessageId)
}
