package checkback

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func checkReq() *txmqv1.CheckTransactionRequest {
	return &txmqv1.CheckTransactionRequest{
		MessageId: "m1", Topic: "orders", ProducerGroup: "shop", TransactionId: "order-42:paid",
		Key: "k", Properties: map[string]string{"p": "v"}, Body: []byte{0, 1, 2}, Attempt: 2,
		CreatedAt: timestamppb.New(t0),
	}
}

// wireCheck is the documented JSON of an HTTP check-back, as a plain web
// server with its own code would read it.
type wireCheck struct {
	MessageID     string            `json:"message_id"`
	Topic         string            `json:"topic"`
	ProducerGroup string            `json:"producer_group"`
	TransactionID string            `json:"transaction_id"`
	Key           string            `json:"key"`
	Properties    map[string]string `json:"properties"`
	BodyBase64    string            `json:"body_base64"`
	Attempt       uint32            `json:"attempt"`
	CreatedAt     string            `json:"created_at"`
}

// A plain net/http handler answers checks in the JSON form.
func TestHTTPEndpoint(t *testing.T) {
	var got wireCheck
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, http.MethodPost, r.Method)
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		require.NoError(t, json.NewDecoder(r.Body).Decode(&got))
		switch got.TransactionID {
		case "order-42:paid":
			w.Write([]byte(`{"resolution":"commit"}`))
		case "order-43:paid":
			w.Write([]byte(`{"resolution":"rollback"}`))
		case "order-44:paid":
			w.Write([]byte(`{"resolution":"unknown"}`))
		case "broken":
			w.WriteHeader(http.StatusInternalServerError)
			w.Write([]byte(`{"error":"db down"}`))
		default:
			w.Write([]byte(`{"resolution":"maybe"}`))
		}
	}))
	defer srv.Close()
	c := NewNetCaller(nil)
	defer c.Close()
	ep, err := ParseEndpoint(srv.URL + "/check")
	require.NoError(t, err)
	ctx := context.Background()

	req := checkReq()
	res, err := c.Check(ctx, ep, req)
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_COMMIT, res)
	require.Equal(t, "m1", got.MessageID)
	require.Equal(t, "shop", got.ProducerGroup)
	require.Equal(t, uint32(2), got.Attempt)
	require.Equal(t, map[string]string{"p": "v"}, got.Properties)
	body, err := base64.StdEncoding.DecodeString(got.BodyBase64)
	require.NoError(t, err)
	require.Equal(t, []byte{0, 1, 2}, body)
	created, err := time.Parse(time.RFC3339Nano, got.CreatedAt)
	require.NoError(t, err)
	require.True(t, created.Equal(t0))

	for tx, want := range map[string]txmqv1.Resolution{
		"order-43:paid": txmqv1.Resolution_RESOLUTION_ROLLBACK,
		"order-44:paid": txmqv1.Resolution_RESOLUTION_UNKNOWN,
	} {
		req.TransactionId = tx
		res, err := c.Check(ctx, ep, req)
		require.NoError(t, err)
		require.Equal(t, want, res)
	}
	req.TransactionId = "broken"
	_, err = c.Check(ctx, ep, req)
	require.ErrorContains(t, err, "HTTP 500 db down")
	require.False(t, errors.Is(err, ErrNotReached), "the producer answered: it counts")
	req.TransactionId = "odd"
	_, err = c.Check(ctx, ep, req)
	require.ErrorContains(t, err, `"maybe"`)
}

type checker struct {
	txmqv1.UnimplementedTransactionCheckerServer
	res txmqv1.Resolution
}

func (c *checker) CheckTransaction(ctx context.Context, req *txmqv1.CheckTransactionRequest) (*txmqv1.CheckTransactionResponse, error) {
	return &txmqv1.CheckTransactionResponse{Resolution: c.res}, nil
}

func TestGRPCEndpoint(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	txmqv1.RegisterTransactionCheckerServer(srv, &checker{res: txmqv1.Resolution_RESOLUTION_ROLLBACK})
	go srv.Serve(lis)
	defer srv.Stop()
	c := NewNetCaller(nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := c.Check(ctx, Endpoint{GRPC: lis.Addr().String()}, checkReq())
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_ROLLBACK, res)
}

// Nothing listening: the check did not reach a producer.
func TestUnreachableEndpoints(t *testing.T) {
	// A privileged port, which the system never hands out, and where
	// nothing listens: a port chosen and closed could be taken meanwhile.
	const addr = "127.0.0.1:1"
	c := NewNetCaller(nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := c.Check(ctx, Endpoint{GRPC: addr}, checkReq())
	require.ErrorIs(t, err, ErrNotReached)
	_, err = c.Check(ctx, Endpoint{HTTP: "http://" + addr + "/check"}, checkReq())
	require.ErrorIs(t, err, ErrNotReached)
}

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]Endpoint{
		"grpc://127.0.0.1:9000":      {GRPC: "127.0.0.1:9000"},
		"http://shop.internal/tx":    {HTTP: "http://shop.internal/tx"},
		"https://shop.internal/tx":   {HTTP: "https://shop.internal/tx"},
		"https://shop.internal:8443": {HTTP: "https://shop.internal:8443"},
	} {
		got, err := ParseEndpoint(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got)
		require.Equal(t, in, got.String())
	}
	for _, bad := range []string{"ftp://x", "grpc://nohostport", "http://", "127.0.0.1:80", ""} {
		_, err := ParseEndpoint(bad)
		require.Error(t, err, bad)
	}
}

func TestRegistryLeases(t *testing.T) {
	clock := &fakeClock{now: t0}
	joined := 0
	r := newRegistry(clock.Now, 10*time.Second, func(string) { joined++ })
	r.Register("shop", "a", Endpoint{GRPC: "127.0.0.1:1"})
	r.Register("shop", "b", Endpoint{GRPC: "127.0.0.1:2"})
	require.Equal(t, 1, joined, "woken once, when the group gets its first live instance")
	require.True(t, r.HasLive("shop"))
	require.False(t, r.HasLive("billing"))

	clock.Set(t0.Add(8 * time.Second))
	_, err := r.Heartbeat("shop", "a", Endpoint{})
	require.NoError(t, err)
	clock.Set(t0.Add(12 * time.Second))
	_, err = r.Heartbeat("shop", "b", Endpoint{})
	require.ErrorIs(t, err, ErrUnknownInstance, "b missed its lease")
	for i := 0; i < 3; i++ {
		in, ok := r.Pick("shop")
		require.True(t, ok)
		require.Equal(t, "a", in.ID)
	}
	require.Len(t, r.List(""), 1)
	clock.Set(t0.Add(30 * time.Second))
	_, ok := r.Pick("shop")
	require.False(t, ok)
	r.Register("shop", "a", Endpoint{GRPC: "127.0.0.1:1"})
	require.Equal(t, 2, joined)
	r.Reset()
	require.False(t, r.HasLive("shop"))
	_, err = r.Heartbeat("shop", "a", Endpoint{})
	require.ErrorIs(t, err, ErrUnknownInstance, "after a leader change instances register again")
}

// testSession is a Session that answers every check with answer.
type testSession struct {
	peer   string
	answer txmqv1.Resolution
}

func (s *testSession) Check(context.Context, *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	return s.answer, nil
}

func (s *testSession) Peer() string { return s.peer }

// An instance registered on a session: heartbeats renew it only on that
// session, a session that ends forgets only what registered on it, and a
// new term of leadership keeps it (its stream to this node is open).
func TestRegistrySessions(t *testing.T) {
	clock := &fakeClock{now: t0}
	r := newRegistry(clock.Now, 10*time.Second, nil)
	first := Endpoint{Session: &testSession{peer: "10.0.0.5:50001", answer: txmqv1.Resolution_RESOLUTION_COMMIT}}
	second := Endpoint{Session: &testSession{peer: "10.0.0.5:50002"}}
	require.Equal(t, "session://10.0.0.5:50001", first.String())
	require.False(t, first.IsZero())
	c := NewNetCaller(nil)
	defer c.Close()
	res, err := c.Check(context.Background(), first, checkReq())
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_COMMIT, res, "the caller asks a session endpoint on its session")
	r.Register("shop", "a", first)
	r.Register("shop", "b", Endpoint{GRPC: "127.0.0.1:2"})

	_, err = r.Heartbeat("shop", "a", first)
	require.NoError(t, err)
	_, err = r.Heartbeat("shop", "a", second)
	require.ErrorIs(t, err, ErrUnknownInstance, "a heartbeat on another session")

	r.Reset()
	require.Equal(t, []string{"a"}, instanceIDs(r.List("shop")), "a new term forgets only instances registered by address")

	r.Register("shop", "a", second)
	require.False(t, r.Unregister("shop", "a", first), "the first session ended after the instance moved to the second")
	require.True(t, r.HasLive("shop"))
	require.True(t, r.Unregister("shop", "a", second))
	require.False(t, r.HasLive("shop"), "gone at once, before its lease ends")
	require.False(t, r.Unregister("shop", "a", second))
}

func instanceIDs(list []Instance) []string {
	var out []string
	for _, in := range list {
		out = append(out, in.ID)
	}
	return out
}
