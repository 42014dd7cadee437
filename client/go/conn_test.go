package txmq

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func newTestConn(t *testing.T, cfg ConnConfig) *Conn {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = discardLogger
	}
	c, err := Dial(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

// sendCall is a Call that sends a plain message to topic and records where
// it went.
func sendCall(topic string, to *[]string) Call {
	return func(ctx context.Context, addr string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		*to = append(*to, addr)
		_, err := txmqv1.NewProducerServiceClient(cc).Send(ctx, &txmqv1.SendRequest{Topic: topic, Body: []byte("x")}, opts...)
		return err
	}
}

// answering is a fake node whose Send answers err (success when nil).
func answering(t *testing.T, err error) (*fakeProducer, string) {
	f := &fakeProducer{send: func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		if err != nil {
			return nil, err
		}
		return &txmqv1.SendResponse{MessageId: "m1"}, nil
	}}
	return f, startProducerServer(t, f)
}

func TestDialValidates(t *testing.T) {
	for name, cfg := range map[string]ConnConfig{
		"empty address":    {Addrs: []string{"127.0.0.1:1", ""}},
		"negative timeout": {RetryTimeout: -time.Second},
	} {
		_, err := Dial(cfg)
		require.ErrorIs(t, err, ErrInvalidArgument, name)
	}
	// DialOptions without credentials get the Conn's own: TLS when TLS is
	// set, else plaintext.
	newTestConn(t, ConnConfig{DialOptions: []grpc.DialOption{grpc.WithUserAgent("x")}})
	c := newTestConn(t, ConnConfig{Addrs: []string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:1"}})
	require.Equal(t, []string{"127.0.0.1:1", "127.0.0.1:2"}, c.addrs, "duplicates count once")
	require.Equal(t, defaultRetryTimeout, c.retryTimeout)

	require.NoError(t, c.Close())
	err := c.Invoke(t.Context(), true, func(context.Context, string, grpc.ClientConnInterface, ...grpc.CallOption) error {
		t.Error("called after Close")
		return nil
	})
	require.ErrorIs(t, err, ErrClosed)
}

// Two nodes that name each other as the leader: the call follows
// maxRedirects of their answers, then tries the next configured address.
func TestRedirectLoopMovesOn(t *testing.T) {
	a, addrA := answering(t, nil)
	b, addrB := answering(t, nil)
	a.send = func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return nil, notLeaderErr(t, addrB)
	}
	b.send = func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return nil, notLeaderErr(t, addrA)
	}
	_, addrC := answering(t, nil)
	c := newTestConn(t, ConnConfig{Addrs: []string{addrA, addrB, addrC}})

	var to []string
	require.NoError(t, c.Invoke(t.Context(), false, sendCall("t", &to)))
	require.Equal(t, []string{addrA, addrB, addrA, addrB, addrC}, to)
	to = nil
	require.NoError(t, c.Invoke(t.Context(), false, sendCall("t", &to)))
	require.Equal(t, []string{addrC}, to, "the next call starts where the last one succeeded")
}

func TestInvokeAnyDoesNotFollowNotLeader(t *testing.T) {
	leader, leaderAddr := answering(t, nil)
	_, followerAddr := answering(t, notLeaderErr(t, leaderAddr))
	_, otherAddr := answering(t, nil)
	c := newTestConn(t, ConnConfig{Addrs: []string{followerAddr, otherAddr}})

	var to []string
	require.NoError(t, c.InvokeAny(t.Context(), sendCall("t", &to)))
	require.Equal(t, []string{followerAddr, otherAddr}, to)
	require.Zero(t, leader.Count("Send"))
}

func TestInvokeOn(t *testing.T) {
	_, leaderAddr := answering(t, nil)
	_, followerAddr := answering(t, notLeaderErr(t, leaderAddr))
	var n atomic.Int32
	flaky := &fakeProducer{send: func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		if n.Add(1) <= 2 {
			return nil, status.Error(codes.Unavailable, "shutting down")
		}
		return &txmqv1.SendResponse{}, nil
	}}
	flakyAddr := startProducerServer(t, flaky)
	c := newTestConn(t, ConnConfig{Addrs: []string{leaderAddr}})

	var to []string
	require.NoError(t, c.InvokeOn(t.Context(), flakyAddr, sendCall("t", &to)))
	require.Equal(t, []string{flakyAddr, flakyAddr, flakyAddr}, to, "retried on that node only")

	to = nil
	err := c.InvokeOn(t.Context(), followerAddr, sendCall("t", &to))
	require.ErrorIs(t, err, ErrUnavailable)
	require.Equal(t, []string{followerAddr}, to, "a NotLeader answer is final")

	to = nil
	require.NoError(t, c.Invoke(t.Context(), false, sendCall("t", &to)))
	require.Equal(t, []string{leaderAddr}, to, "InvokeOn leaves the target alone")
}

func TestFollow(t *testing.T) {
	_, addrA := answering(t, nil)
	_, addrB := answering(t, nil)
	_, leaderAddr := answering(t, nil)
	c := newTestConn(t, ConnConfig{Addrs: []string{addrA, addrB}})
	next := func() string {
		var to []string
		require.NoError(t, c.Invoke(t.Context(), true, sendCall("t", &to)))
		return to[0]
	}

	require.Equal(t, addrA, next())
	c.Follow(addrA, status.Error(codes.NotFound, "topic t not found"))
	require.Equal(t, addrA, next(), "only Unavailable moves the target")
	c.Follow(addrA, notLeaderErr(t, leaderAddr))
	require.Equal(t, leaderAddr, next())
	c.Follow(leaderAddr, status.Error(codes.Unavailable, "shutting down"))
	require.Equal(t, addrB, next())
	c.Follow(addrA, status.Error(codes.Unavailable, "old news"))
	require.Equal(t, addrB, next(), "an answer from where the target no longer is changes nothing")
}
