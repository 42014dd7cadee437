package clienttest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/internal/txmqtest"
)

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

// kill -9 of the leader of three broker processes during a RocketMQ
// workload: the clients find the new leader through the others (followers
// name the leader in route answers, from the addresses the nodes
// announced), no acknowledged send
// is lost, and no rolled-back message is delivered. The Go client re-reads
// routes every 30 s, so the re-routing time is up to that; the test logs it.
func TestClusterLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three broker processes")
	}
	pc := startProcCluster(t)
	leader := pc.leader()
	names := pc.names()
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
	killed := time.Now()
	pc.kill(leader)
	var rerouted time.Time
	txmqtest.CheckFor(t, 90*time.Second, 50*time.Millisecond, func() error {
		var ok bool
		if rerouted, ok = w.firstAckAfter(killed); !ok {
			return fmt.Errorf("no send acknowledged since the leader was killed")
		}
		return nil
	})
	t.Logf("leader %s killed; first acknowledged send after it: %s later", leader, rerouted.Sub(killed).Round(time.Millisecond))
	// A few more after the re-routing, then every acknowledged one.
	n := len(w.snapshot())
	txmqtest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if len(w.snapshot()) < n+20 {
			return fmt.Errorf("%d sends acknowledged", len(w.snapshot()))
		}
		return nil
	})
	e.waitFor(got, w.snapshot()...)
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
