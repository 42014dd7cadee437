package clienttest

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/apache/rocketmq-client-go/v2/rlog"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/rocketmq"
)

func TestMain(m *testing.M) {
	rlog.SetLogLevel("fatal")
	os.Exit(m.Run())
}

// env is a one-node txmq broker with the RocketMQ front end, and an admin
// client of its gRPC API.
type env struct {
	t     testing.TB
	names []string // the RocketMQ name servers (and brokers)
	admin txmqv1.AdminServiceClient
	api   string // the node's gRPC address
	// group names are unique per env, since the RocketMQ client keeps
	// process-wide state per group and client ID.
	prefix string
}

var envs atomic.Int32

func newEnv(t testing.TB) *env {
	c := txmqtest.NewCluster(t, 1, func(s txmqtest.Spec) (*broker.Broker, error) {
		return broker.Open(broker.Config{
			Raft: s.Raft, GRPCListener: s.API, Logger: txmqtest.Logger(),
			DefaultCheckAfter: time.Second,
			CheckBack: checkback.Config{
				Policy:            checkback.Policy{Backoff: 500 * time.Millisecond, MaxBackoff: time.Second},
				HeartbeatInterval: 100 * time.Millisecond, Lease: time.Second,
				ScanInterval: 100 * time.Millisecond,
			},
		})
	})
	b := c.Leader()
	lis, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := rocketmq.Serve(lis, rocketmq.Config{Broker: b, Logger: txmqtest.Logger(), MaxPollWait: 2 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close() })
	conn, err := grpc.NewClient(b.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &env{t: t, names: []string{srv.Addr()}, admin: txmqv1.NewAdminServiceClient(conn), api: b.Addr(), prefix: fmt.Sprintf("e%d", envs.Add(1))}
}

func (e *env) name(s string) string { return e.prefix + "-" + s }

func (e *env) producerOpts(group string) []producer.Option {
	return []producer.Option{
		producer.WithNameServer(e.names),
		producer.WithGroupName(group),
		producer.WithInstanceName(group),
		producer.WithRetry(2),
		producer.WithSendMsgTimeout(5 * time.Second),
	}
}

func (e *env) producer(group string) rocketmqProducer {
	p, err := producer.NewDefaultProducer(e.producerOpts(group)...)
	require.NoError(e.t, err)
	require.NoError(e.t, p.Start())
	e.t.Cleanup(func() { p.Shutdown() })
	return p
}

type rocketmqProducer interface {
	SendSync(ctx context.Context, mq ...*primitive.Message) (*primitive.SendResult, error)
	SendAsync(ctx context.Context, f func(context.Context, *primitive.SendResult, error), mq ...*primitive.Message) error
	SendOneWay(ctx context.Context, mq ...*primitive.Message) error
}

// received collects what a push consumer got, by body.
type received struct {
	mu     sync.Mutex
	counts map[string]int
	by     map[string]map[string]int // instance → body → count
}

func newReceived() *received {
	return &received{counts: map[string]int{}, by: map[string]map[string]int{}}
}

func (r *received) add(instance string, msgs []*primitive.MessageExt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.by[instance] == nil {
		r.by[instance] = map[string]int{}
	}
	for _, m := range msgs {
		r.counts[string(m.Body)]++
		r.by[instance][string(m.Body)]++
	}
}

func (r *received) count(body string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[body]
}

func (r *received) snapshot() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.counts {
		out[k] = v
	}
	return out
}

// waitFor polls until every body arrived (at least once).
func (e *env) waitFor(r *received, bodies ...string) {
	e.t.Helper()
	// Long enough for a client to re-read its routes (every 30 s) after
	// a leader change.
	txmqtest.CheckFor(e.t, 120*time.Second, 50*time.Millisecond, func() error {
		for _, b := range bodies {
			if r.count(b) == 0 {
				return fmt.Errorf("%q not received yet; got %v", b, r.snapshot())
			}
		}
		return nil
	})
}

// consumer starts a clustering push consumer of topic in group, from the
// first offset, handing what it gets to r (through handle, when set).
func (e *env) consumer(group, instance, topic string, r *received, handle func(*primitive.MessageExt) consumer.ConsumeResult, opts ...consumer.Option) func() {
	opts = append([]consumer.Option{
		consumer.WithNameServer(e.names),
		consumer.WithGroupName(group),
		consumer.WithInstance(instance),
		consumer.WithConsumerModel(consumer.Clustering),
		consumer.WithConsumeFromWhere(consumer.ConsumeFromFirstOffset),
	}, opts...)
	c, err := consumer.NewPushConsumer(opts...)
	require.NoError(e.t, err)
	require.NoError(e.t, c.Subscribe(topic, consumer.MessageSelector{}, func(ctx context.Context, msgs ...*primitive.MessageExt) (consumer.ConsumeResult, error) {
		if handle != nil {
			for _, m := range msgs {
				if res := handle(m); res != consumer.ConsumeSuccess {
					return res, nil
				}
			}
		}
		r.add(instance, msgs)
		return consumer.ConsumeSuccess, nil
	}))
	require.NoError(e.t, c.Start())
	var once sync.Once
	stop := func() { once.Do(func() { c.Shutdown() }) }
	e.t.Cleanup(stop)
	return stop
}

// halfStates lists the states of the half messages of a producer group,
// by transaction ID.
func (e *env) halfStates(group string) map[string]txmqv1.HalfState {
	e.t.Helper()
	r, err := e.admin.ListHalfMessages(context.Background(), &txmqv1.ListHalfMessagesRequest{ProducerGroup: group})
	require.NoError(e.t, err)
	out := map[string]txmqv1.HalfState{}
	for _, h := range r.GetMessages() {
		out[h.GetTransactionId()] = h.GetState()
	}
	return out
}
