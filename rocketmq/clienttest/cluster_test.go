package clienttest

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/rocketmq"
)

// rmqNode is a cluster node with its RocketMQ front end: stopping the
// node closes both, as a killed process would.
type rmqNode struct {
	*broker.Broker
	rmq *rocketmq.Server
}

func (n *rmqNode) Close() error {
	n.rmq.Close()
	return n.Broker.Close()
}

// byBody answers check-backs from the message body, as a producer's
// records would.
type byBody struct{}

func (byBody) ExecuteLocalTransaction(m *primitive.Message) primitive.LocalTransactionState {
	return verdict(string(m.Body))
}

func (byBody) CheckLocalTransaction(m *primitive.MessageExt) primitive.LocalTransactionState {
	return verdict(string(m.Body))
}

func verdict(body string) primitive.LocalTransactionState {
	if strings.HasPrefix(body, "tx-commit") {
		return primitive.CommitMessageState
	}
	return primitive.RollbackMessageState
}

// workload sends plain and transactional messages until stopped, and
// remembers which were acknowledged, and when.
type workload struct {
	mu      sync.Mutex
	acked   []string
	ackedAt []time.Time
	commits []string
}

func (w *workload) run(p rocketmqProducer, tp interface {
	SendMessageInTransaction(context.Context, *primitive.Message) (*primitive.TransactionSendResult, error)
}, topic string, stop <-chan struct{}) {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		default:
		}
		body := fmt.Sprint("m-", i)
		if _, err := p.SendSync(context.Background(), primitive.NewMessage(topic, []byte(body))); err == nil {
			w.mu.Lock()
			w.acked = append(w.acked, body)
			w.ackedAt = append(w.ackedAt, time.Now())
			w.mu.Unlock()
		}
		if i%4 != 0 {
			continue
		}
		body = fmt.Sprint("tx-commit-", i)
		if i%8 == 0 {
			body = fmt.Sprint("tx-rollback-", i)
		}
		r, err := tp.SendMessageInTransaction(context.Background(), primitive.NewMessage(topic, []byte(body)))
		if err == nil && r.State == primitive.CommitMessageState {
			w.mu.Lock()
			w.commits = append(w.commits, body)
			w.mu.Unlock()
		}
	}
}

// firstAckAfter is when the first send acknowledged after t was.
func (w *workload) firstAckAfter(t time.Time) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, at := range w.ackedAt {
		if at.After(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// The leader of a three-node cluster stops during a RocketMQ workload:
// the clients find the new leader through the others (followers name the
// leader in route answers), no acknowledged send is lost, and no rolled
// back message is delivered. The Go client re-reads routes every 30 s, so
// the re-routing time is up to that; the test logs it.
func TestClusterLeaderLoss(t *testing.T) {
	ids := []string{"n1", "n2", "n3"}
	lis := map[string]net.Listener{}
	peers := map[string]string{}
	var names []string
	for _, id := range ids {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		require.NoError(t, err)
		lis[id], peers[id] = l, l.Addr().String()
		names = append(names, l.Addr().String())
	}
	c := txmqtest.NewCluster(t, 3, func(s txmqtest.Spec) (*rmqNode, error) {
		b, err := broker.Open(broker.Config{Raft: s.Raft, GRPCListener: s.API, Join: s.Join, Logger: txmqtest.Logger()})
		if err != nil {
			return nil, err
		}
		srv, err := rocketmq.Serve(lis[s.Raft.NodeID], rocketmq.Config{Broker: b, Logger: txmqtest.Logger(), Peers: peers, MaxPollWait: 2 * time.Second})
		if err != nil {
			b.Close()
			return nil, err
		}
		return &rmqNode{Broker: b, rmq: srv}, nil
	})
	leader := c.Leader()
	topic := "failover"
	opts := []producer.Option{producer.WithNameServer(names), producer.WithRetry(2), producer.WithSendMsgTimeout(2 * time.Second)}
	p, err := producer.NewDefaultProducer(append(opts, producer.WithGroupName("fo-plain"), producer.WithInstanceName("fo-plain"))...)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { p.Shutdown() })
	tp, err := producer.NewTransactionProducer(byBody{}, append(opts, producer.WithGroupName("fo-tx"), producer.WithInstanceName("fo-tx"))...)
	require.NoError(t, err)
	require.NoError(t, tp.Start())
	t.Cleanup(func() { tp.Shutdown() })

	e := &env{t: t, names: names}
	got := newReceived()
	e.consumer("fo-consumers", "c1", topic, got, nil)

	w := &workload{}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); w.run(p, tp, topic, stop) }()
	defer func() { close(stop); <-done }()
	txmqtest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := len(w.snapshot()); n < 20 {
			return fmt.Errorf("%d sends acknowledged", n)
		}
		return nil
	})
	stopped := time.Now()
	c.Stop(leader.Node().ID())
	var rerouted time.Time
	txmqtest.CheckFor(t, 90*time.Second, 50*time.Millisecond, func() error {
		var ok bool
		if rerouted, ok = w.firstAckAfter(stopped); !ok {
			return fmt.Errorf("no send acknowledged since the leader stopped")
		}
		return nil
	})
	t.Logf("leader %s stopped; first acknowledged send after it: %s later", leader.Node().ID(), rerouted.Sub(stopped).Round(time.Millisecond))
	acked := w.snapshot()
	e.waitFor(got, acked...)
	w.mu.Lock()
	commits := append([]string(nil), w.commits...)
	w.mu.Unlock()
	e.waitFor(got, commits...)
	for b := range got.snapshot() {
		require.False(t, strings.HasPrefix(b, "tx-rollback"), "a rolled-back message was delivered: %s", b)
	}
}

func (w *workload) snapshot() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.acked...)
}
