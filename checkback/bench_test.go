package checkback

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// BenchmarkResolveOrphans: b.N half messages are orphaned (due, nobody
// registered); then a producer comes up answering COMMIT over gRPC on
// loopback. Reports how many check-backs per second resolve them.
//
//	go test -run XXX -bench ResolveOrphans -benchtime 10000x ./checkback/
func BenchmarkResolveOrphans(b *testing.B) {
	e := newEnv(b, func(c *Config) { c.Now = time.Now })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	txmqv1.RegisterTransactionCheckerServer(srv, &checker{res: txmqv1.Resolution_RESOLUTION_COMMIT})
	go srv.Serve(lis)
	defer srv.Stop()

	ctx := context.Background()
	past := time.Now().Add(-time.Hour).UnixNano()
	for i := 0; i < b.N; i += 500 {
		errs := make(chan error, 500)
		n := min(500, b.N-i)
		for j := 0; j < n; j++ {
			go func(k int) {
				id := fmt.Sprintf("m%08d", k)
				_, err := e.node.Propose(ctx, &raftpb.Command{Now: past, Op: &raftpb.Command_SendHalf{SendHalf: &raftpb.SendHalf{
					Topic: "orders", MessageId: id, ProducerGroup: "shop", TransactionId: id,
					Body: make([]byte, 256), CreateTopic: true, CheckAfter: int64(time.Second),
				}}})
				errs <- err
			}(i + j)
		}
		for j := 0; j < n; j++ {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.Run(runCtx)
	}()
	b.ResetTimer()
	start := time.Now()
	e.s.Registry().Register("shop", "i1", Endpoint{GRPC: lis.Addr().String()})
	for {
		var pending int
		if err := e.node.Store().View(func(tx *halfstore.Tx) error {
			hs, err := tx.DueHalf("shop", time.Now().UnixNano(), nil, nil, 1)
			pending = len(hs)
			return err
		}); err != nil {
			b.Fatal(err)
		}
		if pending == 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	<-done
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "checks/s")
}
