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
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// orphansPerOp is how many half messages one op of ResolveOrphans resolves.
const orphansPerOp = 10000

// BenchmarkResolveOrphans: each op orphans 10,000 half messages (due,
// nobody registered, not timed); then a producer of their group comes up
// answering COMMIT over gRPC on loopback, and the op ends when none is
// pending. Reports resolved half messages per second.
//
//	go test -run '^$' -bench ResolveOrphans -benchtime 3x ./checkback/
func BenchmarkResolveOrphans(b *testing.B) {
	e := newEnv(b, func(c *Config) {
		c.Now = time.Now
		c.Caller = NewNetCaller(nil)
	})
	b.Cleanup(func() { e.s.Close() })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	txmqv1.RegisterTransactionCheckerServer(srv, &checker{res: txmqv1.Resolution_RESOLUTION_COMMIT})
	go srv.Serve(lis)
	defer srv.Stop()

	ctx := context.Background()
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.Run(runCtx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	var elapsed time.Duration
	b.ResetTimer()
	for op := range b.N {
		b.StopTimer()
		group := fmt.Sprint("shop", op)
		ids := orphans(b, e, group)
		b.StartTimer()
		start := time.Now()
		e.s.Registry().Register(group, "i1", Endpoint{GRPC: lis.Addr().String()})
		txmqtest.CheckFor(b, 5*time.Minute, time.Millisecond, func() error { return due(b, e, group) })
		elapsed += time.Since(start)
		b.StopTimer()
		if err := e.node.Store().View(func(tx *halfstore.Tx) error {
			for _, id := range ids {
				h, err := tx.Half(id)
				if err != nil {
					return err
				}
				if h.State != storepb.HalfState_HALF_STATE_COMMITTED {
					return fmt.Errorf("%s is %s", id, halfstore.StateName(h.State))
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*orphansPerOp)/elapsed.Seconds(), "resolved/s")
}

// orphans stores orphansPerOp half messages of group, created an hour ago.
func orphans(b *testing.B, e *env, group string) []string {
	past := time.Now().Add(-time.Hour)
	ids := make([]string, orphansPerOp)
	for i := 0; i < orphansPerOp; i += 500 {
		errs := make(chan error, 500)
		n := min(500, orphansPerOp-i)
		for j := range n {
			ids[i+j] = fmt.Sprintf("%s-m%08d", group, i+j)
			go func(id string) {
				_, err := e.node.SendHalf(context.Background(), past, &raftpb.SendHalf{
					Topic: "orders", MessageId: id, ProducerGroup: group, TransactionId: id,
					Body: make([]byte, 256), CreateTopic: true, CheckAfter: int64(time.Second),
				})
				errs <- err
			}(ids[i+j])
		}
		for range n {
			if err := <-errs; err != nil {
				b.Fatal(err)
			}
		}
	}
	return ids
}

// due fails while a message of group is still due for a check.
func due(b *testing.B, e *env, group string) error {
	var hs []*storepb.Half
	if err := e.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		hs, err = tx.DueHalf(group, time.Now().UnixNano(), nil, nil, 1)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	if len(hs) > 0 {
		return fmt.Errorf("%s still has due messages", group)
	}
	return nil
}
