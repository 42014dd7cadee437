package clienttest

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/stretchr/testify/require"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// undecided answers UNKNOWN, when executed and when checked: its
// messages stay pending until someone else resolves them.
type undecided struct{ checks atomic.Int32 }

func (*undecided) ExecuteLocalTransaction(*primitive.Message) primitive.LocalTransactionState {
	return primitive.UnkonwnState
}

func (u *undecided) CheckLocalTransaction(*primitive.MessageExt) primitive.LocalTransactionState {
	u.checks.Add(1)
	return primitive.UnkonwnState
}

// runBrokerctl runs the brokerctl binary against the env's gRPC API and
// returns its standard output.
func (e *env) runBrokerctl(bin string, args ...string) string {
	e.t.Helper()
	cmd := exec.Command(bin, append([]string{"--addr", e.api, "--timeout", "10s"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(e.t, cmd.Run(), "brokerctl %v: %s", args, stderr.String())
	return stdout.String()
}

// A RocketMQ transactional message left pending (the listener answers
// UNKNOWN) is listed, shown and committed by the real brokerctl, and a
// RocketMQ push consumer then gets it once.
func TestBrokerctlResolvesRocketMQHalf(t *testing.T) {
	if testing.Short() {
		t.Skip("builds brokerctl")
	}
	e := newEnv(t)
	bin := filepath.Join(t.TempDir(), "brokerctl")
	// Built in the root module, whose go.sum has brokerctl's dependencies.
	build := exec.Command("go", "build", "-o", bin, "./cmd/brokerctl")
	build.Dir = "../.."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)

	topic, group := e.name("ctl-orders"), e.name("ctl-tx")
	l := &undecided{}
	p, err := producer.NewTransactionProducer(l, e.producerOpts(group)...)
	require.NoError(t, err)
	require.NoError(t, p.Start())
	t.Cleanup(func() { p.Shutdown() })
	r, err := p.SendMessageInTransaction(context.Background(), primitive.NewMessage(topic, []byte("held")))
	require.NoError(t, err)
	require.Equal(t, primitive.UnkonwnState, r.State)

	var listed []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(e.runBrokerctl(bin, "-o", "json", "half", "list", "--group", group)), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), "a JSON line: %s", line)
		listed = append(listed, m)
	}
	require.Len(t, listed, 1)
	require.Equal(t, r.TransactionID, listed[0]["transaction_id"], "the RocketMQ transaction ID is txmq's")
	require.Equal(t, topic, listed[0]["topic"])
	require.Equal(t, "PENDING", listed[0]["state"])
	id := listed[0]["id"].(string)

	shown := e.runBrokerctl(bin, "half", "show", id)
	for _, want := range []string{id, group, r.TransactionID, "PENDING", "held"} {
		require.Contains(t, shown, want)
	}
	e.runBrokerctl(bin, "half", "commit", id)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_COMMITTED, e.halfStates(group)[r.TransactionID])

	got := newReceived()
	e.consumer(e.name("ctl-consumers"), "c1", topic, got, nil)
	e.waitFor(got, "held")
	// A message sent after it, once received, says the consumer has read
	// past it: it came once.
	plain := e.producer(e.name("ctl-plain"))
	_, err = plain.SendSync(context.Background(), primitive.NewMessage(topic, []byte("after")))
	require.NoError(t, err)
	e.waitFor(got, "after")
	require.Equal(t, 1, got.count("held"))
}
