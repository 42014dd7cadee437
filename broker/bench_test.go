package broker

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// Benchmarks of whole transactions over gRPC on loopback against a
// single-node broker: each op is SendHalf then Commit, both fsynced through
// Raft. Run with:
//
//	go test -run XXX -bench . -benchtime 3s ./broker/
//
// They report tx/s and latency percentiles as extra metrics.
var benchTx atomic.Uint64

func transaction(ctx context.Context, tb *testBroker, body []byte) error {
	tx := fmt.Sprint("bench-", benchTx.Add(1))
	r, err := tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "bench", ProducerGroup: "g", TransactionId: tx, Body: body})
	if err != nil {
		return err
	}
	_, err = tb.producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{
		Target: &txmqv1.EndTransactionRequest_MessageId{MessageId: r.MessageId}, Resolution: txmqv1.Resolution_RESOLUTION_COMMIT,
	})
	return err
}

func runBench(b *testing.B, producers int, op func(context.Context, *testBroker, []byte) error) {
	runBenchOn(b, startBroker(b, nil), producers, op)
}

func runBenchOn(b *testing.B, tb *testBroker, producers int, op func(context.Context, *testBroker, []byte) error) {
	body := make([]byte, 256)
	ctx := context.Background()
	var mu sync.Mutex
	var lat []time.Duration
	var next atomic.Int64
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for p := 0; p < producers; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				if err := op(ctx, tb, body); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return float64(lat[int(p*float64(len(lat)-1))].Microseconds())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

func BenchmarkTransaction1(b *testing.B)  { runBench(b, 1, transaction) }
func BenchmarkTransaction16(b *testing.B) { runBench(b, 16, transaction) }

func plainSend(ctx context.Context, tb *testBroker, body []byte) error {
	_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "bench", Body: body})
	return err
}

func BenchmarkSend1(b *testing.B)  { runBench(b, 1, plainSend) }
func BenchmarkSend16(b *testing.B) { runBench(b, 16, plainSend) }

// BenchmarkTokenAuth: what naming a token's principal costs, against an
// auth file of 5 principals with hashes of bcrypt's default cost (as
// brokerctl auth hash makes them): a token already verified (every call
// after the first), one verified afresh (the first call, or every call
// without the cache), a wrong token the first time, and again. Run with
//
//	go test -run XXX -bench TokenAuth -benchtime 20x ./broker/
func BenchmarkTokenAuth(b *testing.B) {
	var file strings.Builder
	file.WriteString("principals:\n")
	for i := range 5 {
		h, err := bcrypt.GenerateFromPassword([]byte(fmt.Sprint("p", i, "-secret")), bcrypt.DefaultCost)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(&file, "  - name: p%d\n    token_hash: %q\n", i, h)
	}
	pol, err := parsePolicy([]byte(file.String()))
	if err != nil {
		b.Fatal(err)
	}
	a := &authorizer{}
	a.pol.Store(pol)
	a.forgetTokens()
	for _, c := range []struct {
		name, token string
		cached      bool
		want        bool
	}{
		{"verified/cached", "p4-secret", true, true},
		{"verified/uncached", "p4-secret", false, true},
		{"wrong/cached", "nobody-secret", true, false},
		{"wrong/uncached", "nobody-secret", false, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			a.tokenPrincipal(pol, c.token)
			for b.Loop() {
				if !c.cached {
					a.forgetTokens()
				}
				if got := a.tokenPrincipal(pol, c.token) != nil; got != c.want {
					b.Fatalf("token %q: principal found %v, want %v", c.token, got, c.want)
				}
			}
		})
	}
}
