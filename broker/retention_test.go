package broker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

// Under a steady load of transactions, keyed sends and acks, with a
// retention of 1 s: old messages, resolved half messages and dedup keys
// disappear, a group that never reads counts what it lost, and the bbolt
// file stops growing because the pages retention frees are reused.
func TestRetentionUnderSteadyLoad(t *testing.T) {
	tb := startBroker(t, func(cfg *Config) {
		cfg.Retention = time.Second
		cfg.RetentionInterval = 50 * time.Millisecond
		cfg.DedupWindow = 500 * time.Millisecond
	})
	ctx := ctxT(t)

	idle := subscribe(t, tb, "t", "idle", 1)
	require.NotNil(t, idle)
	idle.cancel()
	live := subscribe(t, tb, "t", "live", 1000)
	var acked atomic.Int64
	go func() {
		for m := range live.msgs {
			if d := m.GetDelivery(); d != nil {
				// The stream ends with the test; a failed ack is redelivered.
				_ = live.stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: []string{d.MessageId}}}})
				acked.Add(1)
			}
		}
	}()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var firstHalf atomic.Value
	var sent atomic.Int64
	body := make([]byte, 1024)
	// A steady load: each worker paced to 5 rounds a second (a round is a
	// transaction and a keyed send), a rate a loaded CI machine sustains
	// from the start, so that what retention keeps stays the same.
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				r, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "t", ProducerGroup: "p",
					TransactionId: fmt.Sprintf("w%d-%d", w, i), Body: body})
				if err != nil {
					t.Error(err)
					return
				}
				firstHalf.CompareAndSwap(nil, r.MessageId)
				if _, err := end(tb, ctx, r.MessageId, txmqv1.Resolution_RESOLUTION_COMMIT); err != nil {
					t.Error(err)
					return
				}
				if _, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Key: fmt.Sprintf("k%d-%d", w, i), Body: body}); err != nil {
					t.Error(err)
					return
				}
				sent.Add(2)
			}
		}()
	}
	size := func() int64 {
		st, err := tb.Node().Store().Stats()
		require.NoError(t, err)
		return st.FileSize
	}
	// Warm up past the retention period, then watch the file for as long.
	time.Sleep(4 * time.Second)
	mid, midSent := size(), sent.Load()
	time.Sleep(4 * time.Second)
	end, endSent := size(), sent.Load()
	close(stop)
	wg.Wait()
	t.Logf("file %d KiB after %d messages, %d KiB after %d; %d acked by the live group", mid>>10, midSent, end>>10, endSent, acked.Load())
	require.Greater(t, endSent, midSent+100, "the load kept going")
	// A few pages of slack: at this size one more branch page is a lot.
	require.LessOrEqual(t, end, mid+mid/4+64<<10, "the file kept growing under steady load")

	// Topic and group read together: retention goes on meanwhile.
	var first uint64
	var idleGroup *storepb.Group
	require.NoError(t, tb.Node().Store().View(func(tx *halfstore.Tx) error {
		tp, err := tx.Topic("t")
		if err != nil {
			return err
		}
		first = tp.FirstSequence
		idleGroup, err = tx.Group("t", "idle")
		return err
	}))
	require.Greater(t, first, uint64(midSent), "old messages are gone")
	require.Equal(t, first-1, idleGroup.AckedThrough, "the idle group moved past what was dropped")
	require.Equal(t, first-1, idleGroup.Dropped)
	_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: firstHalf.Load().(string)})
	require.Equal(t, codes.NotFound, codeOf(err), "resolved half messages are pruned after retention")
	// A key sent past the dedup window is a new message.
	r, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Key: "k0-0", Body: body})
	require.NoError(t, err)
	require.False(t, r.Duplicate)
}

// BenchmarkSendDuringCleanup compares write latency with nothing to clean
// (idle) and while retention drops 50,000 expired messages (cleanup):
// cleanup runs in bounded batches between the writes.
func BenchmarkSendDuringCleanup(b *testing.B) {
	for _, cleanup := range []bool{false, true} {
		name := "idle"
		if cleanup {
			name = "cleanup"
		}
		b.Run(name, func(b *testing.B) {
			clk := newClock()
			tb := startBroker(b, func(cfg *Config) {
				cfg.Now = clk.Now
				cfg.RetentionInterval = 20 * time.Millisecond
			})
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			body := make([]byte, 256)
			var wg sync.WaitGroup
			var next atomic.Int64
			for w := 0; w < 64; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for next.Add(1) <= 50000 {
						if err := plainSend(ctx, tb, body); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if cleanup {
				// Every message so far is past the 72 h retention now.
				clk.advance(tb.Broker, DefaultRetention+time.Hour)
			}
			runBenchOn(b, tb, 16, plainSend)
			var first uint64
			if err := tb.Node().Store().View(func(tx *halfstore.Tx) error {
				tp, err := tx.Topic("bench")
				first = tp.FirstSequence
				return err
			}); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(first-1), "dropped")
		})
	}
}
