package txmq_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
)

// On a real three-node cluster, a write a follower must refuse (InvokeOn
// does not follow the leader) fails with an error whose text names the
// leader's gRPC address, the one a person can retry on, never its Raft
// address.
func TestClusterNotLeaderNamesTheGRPCAddress(t *testing.T) {
	c := newBrokers(t, 3, nil)
	c.WaitMembers(3)
	leader, follower := c.Leader(), c.Follower()
	conn, err := txmq.Dial(txmq.ConnConfig{Addrs: []string{follower.Addr()}, RetryTimeout: time.Second})
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = conn.InvokeOn(ctx, follower.Addr(), func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		_, err := txmqv1.NewProducerServiceClient(cc).Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")}, opts...)
		return err
	})
	require.ErrorIs(t, err, txmq.ErrUnavailable)
	require.ErrorContains(t, err, "the leader is "+leader.Node().ID()+" at "+leader.Addr())
	require.NotContains(t, err.Error(), c.RaftAddr(leader.Node().ID()))
	c.VerifyStores()
}
