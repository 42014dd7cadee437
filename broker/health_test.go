package broker

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// wantHealth waits until the node's health service reports want for each
// service name.
func wantHealth(t *testing.T, tb *testBroker, want map[string]healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	hc := healthpb.NewHealthClient(tb.conn)
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		for service, status := range want {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
			cancel()
			if err != nil {
				return err
			}
			if r.Status != status {
				return fmt.Errorf("%q is %s, want %s", service, r.Status, status)
			}
		}
		return nil
	})
}

// Every node serves "" and AdminService while it knows a leader; only the
// leader serves ProducerService and ConsumerService, whose calls a
// follower answers with NotLeader. After a leadership transfer the two
// swap.
func TestClusterHealthPerService(t *testing.T) {
	c := newCluster(t, 3, nil)
	c.WaitMembers(3)
	serving, notServing := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	admin := txmqv1.AdminService_ServiceDesc.ServiceName
	producer := txmqv1.ProducerService_ServiceDesc.ServiceName
	consumer := txmqv1.ConsumerService_ServiceDesc.ServiceName
	leader, follower := c.Leader(), c.Follower()
	wantHealth(t, leader, map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": serving, admin: serving, producer: serving, consumer: serving,
	})
	wantHealth(t, follower, map[string]healthpb.HealthCheckResponse_ServingStatus{
		"": serving, admin: serving, producer: notServing, consumer: notServing,
	})

	_, err := healthpb.NewHealthClient(leader.conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: "txmq.v1.NoSuchService"})
	require.Equal(t, codes.NotFound, codeOf(err), "a name that is no service")

	_, err = leader.admin.TransferLeadership(ctxT(t), &txmqv1.TransferLeadershipRequest{NodeId: follower.Node().ID()})
	require.NoError(t, err)
	wantHealth(t, follower, map[string]healthpb.HealthCheckResponse_ServingStatus{producer: serving, consumer: serving})
	wantHealth(t, leader, map[string]healthpb.HealthCheckResponse_ServingStatus{admin: serving, producer: notServing, consumer: notServing})
	c.VerifyStores()
}

// A reflection client, as grpcurl uses, lists the API's services and gets
// their descriptors without the .proto files.
func TestReflectionListsServices(t *testing.T) {
	tb := startBroker(t, nil)
	stream, err := reflectionpb.NewServerReflectionClient(tb.conn).ServerReflectionInfo(ctxT(t))
	require.NoError(t, err)
	ask := func(req *reflectionpb.ServerReflectionRequest) *reflectionpb.ServerReflectionResponse {
		require.NoError(t, stream.Send(req))
		resp, err := stream.Recv()
		require.NoError(t, err)
		return resp
	}
	resp := ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	for _, want := range []string{
		txmqv1.ProducerService_ServiceDesc.ServiceName, txmqv1.ConsumerService_ServiceDesc.ServiceName,
		txmqv1.AdminService_ServiceDesc.ServiceName, healthpb.Health_ServiceDesc.ServiceName,
	} {
		require.True(t, slices.Contains(names, want), "reflection lists %v, not %s", names, want)
	}
	resp = ask(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_FileContainingSymbol{
		FileContainingSymbol: txmqv1.ProducerService_ServiceDesc.ServiceName,
	}})
	require.NotEmpty(t, resp.GetFileDescriptorResponse().GetFileDescriptorProto(), "the descriptor of ProducerService")
	require.NoError(t, stream.CloseSend())
}
