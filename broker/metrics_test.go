package broker

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestMetricsAndHealth(t *testing.T) {
	tb := startBroker(t, func(cfg *Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	ctx := ctxT(t)
	sendHalf(t, tb, "orders", "shop", "t1", "x")
	sendHalf(t, tb, "orders", "shop", "t2", "y")
	for i := 0; i < 3; i++ {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte("m")})
		require.NoError(t, err)
	}
	sub := subscribe(t, tb, "orders", "points", 0)
	d := sub.next(5 * time.Second)
	require.NotNil(t, d)
	require.NotNil(t, sub.next(5*time.Second))
	require.NotNil(t, sub.next(5*time.Second))
	sub.ack(d.MessageId)
	sub.waitConfirm(d.MessageId)
	_, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{ProducerGroup: "bad name"})
	require.Error(t, err)

	base := "http://" + tb.MetricsAddr()
	code, _ := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, code, body)

	_, body = get(t, base+"/metrics")
	for _, want := range []string{
		`txmq_raft_state{state="LEADER"} 1`,
		`txmq_raft_has_leader 1`,
		`txmq_half_messages_pending{group="shop"} 2`,
		`txmq_grpc_requests_total{code="OK",method="/txmq.v1.ProducerService/SendHalf"} 2`,
		`txmq_grpc_requests_total{code="InvalidArgument",method="/txmq.v1.AdminService/ListHalfMessages"} 1`,
		`txmq_grpc_request_duration_seconds_count{method="/txmq.v1.ProducerService/SendHalf"} 2`,
		`txmq_store_file_size_bytes`,
		`txmq_topic_last_sequence{topic="orders"} 3`,
		`txmq_group_lag_messages{group="points",topic="orders"} 2`,
		`txmq_group_in_flight{group="points",topic="orders"} 2`,
		`txmq_group_subscribers{group="points",topic="orders"} 1`,
		`txmq_messages_delivered_total{group="points",topic="orders"} 3`,
		`txmq_messages_acked_total{group="points",topic="orders"} 1`,
		`txmq_raft_apply_batches_total`,
	} {
		require.Contains(t, body, want)
	}
	require.Regexp(t, `txmq_half_oldest_pending_age_seconds\{group="shop"\} [0-9.e+-]+`, body)
	require.NotContains(t, body, "txmq_half_messages_expired{", "no group has expired messages")

	hc := healthpb.NewHealthClient(tb.conn)
	txmqtest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if r.Status != healthpb.HealthCheckResponse_SERVING {
			return errNotYet(r.Status.String())
		}
		return nil
	})
}

// A node with no leader (it waits to join a cluster that is not there) is
// live but not ready.
func TestNotReadyWithoutLeader(t *testing.T) {
	c := newCluster(t, 0, func(cfg *Config) { cfg.MetricsAddr = "127.0.0.1:0" })
	b := c.Start("n1", "127.0.0.1:1")
	base := "http://" + b.MetricsAddr()
	code, _ := get(t, base+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.True(t, strings.Contains(body, "no leader"), body)

	txmqtest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(b.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
			return errNotYet(r.Status.String())
		}
		return nil
	})
}

type errNotYet string

func (e errNotYet) Error() string { return "status " + string(e) }

// A node that starts with no cluster to belong to is not ready; once a
// leader adds it as a voter, it knows the leader and becomes ready.
func TestReadyAfterElection(t *testing.T) {
	c := newCluster(t, 1, func(cfg *Config) {
		if cfg.Raft.NodeID == "n2" {
			cfg.MetricsAddr = "127.0.0.1:0"
		}
	}, txmqtest.Voters(2))
	leader := c.Leader()
	// A new node, neither bootstrapping nor joining: it waits to be added.
	b := c.Start("n2")
	base := "http://" + b.MetricsAddr()
	code, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, body)

	_, err := leader.admin.JoinCluster(ctxT(t), &txmqv1.JoinClusterRequest{NodeId: "n2", RaftAddress: b.Node().RaftAddr(), GrpcAddress: b.Addr()})
	require.NoError(t, err)
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		if code, body := get(t, base+"/readyz"); code != http.StatusOK {
			return errNotYet(body)
		}
		return nil
	})
	_, body = get(t, base+"/metrics")
	require.Contains(t, body, "txmq_raft_has_leader 1")
	require.Contains(t, body, `txmq_raft_state{state="FOLLOWER"} 1`)
	c.WaitMembers(2)
	c.VerifyStores()
}
