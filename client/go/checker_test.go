package txmq

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/txmq/txmq/api/checkhttp"
	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/api/names"
	"github.com/txmq/txmq/checkback"
)

// commitAll is a Checker for tests that do not look at check-backs.
func commitAll(context.Context, HalfMessage) (Resolution, error) { return Commit, nil }

// dialChecker returns a client of the check-back server at addr, as the
// broker would call it.
func dialChecker(t *testing.T, addr string) txmqv1.TransactionCheckerClient {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cc.Close() })
	return txmqv1.NewTransactionCheckerClient(cc)
}

func TestResolutionString(t *testing.T) {
	require.Equal(t, "unknown", Unknown.String())
	require.Equal(t, "commit", Commit.String())
	require.Equal(t, "rollback", Rollback.String())
	require.Equal(t, "Resolution(7)", Resolution(7).String())
}

func TestProducerRegistersForCheckBacks(t *testing.T) {
	f := &fakeProducer{}
	p := newTestProducer(t, ProducerConfig{
		Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", InstanceID: "orders-1", Checker: commitAll,
	})
	require.Equal(t, "orders-1", p.InstanceID())

	// NewProducer waits for the first registration.
	regs := f.Registrations()
	require.Len(t, regs, 1)
	require.Equal(t, "orders", regs[0].GetProducerGroup())
	require.Equal(t, "orders-1", regs[0].GetInstanceId())
	require.Equal(t, p.CallbackAddr(), regs[0].GetEndpoint().GetGrpcAddress())
	host, port, err := net.SplitHostPort(p.CallbackAddr())
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", host)
	require.NotEqual(t, "0", port)

	waitFor(t, "heartbeats", func() bool { return f.Count("Heartbeat orders/orders-1") >= 3 })
	require.Equal(t, 1, f.Count("RegisterProducer"), "heartbeats that succeed need no new registration")
	require.Equal(t, "RegisterProducer orders/orders-1", f.Calls()[0])
}

func TestProducerDefaults(t *testing.T) {
	addr := startProducerServer(t, &fakeProducer{})
	a := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll})
	b := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll})
	require.True(t, names.Valid(a.InstanceID()), "instance ID %q is a valid name", a.InstanceID())
	require.NotEqual(t, a.InstanceID(), b.InstanceID(), "two producers of one process")
	require.NotEqual(t, a.CallbackAddr(), b.CallbackAddr())

	plain := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, ProducerGroup: "orders"})
	require.Empty(t, plain.CallbackAddr(), "no Checker, no check-back server")

	p := newTestProducer(t, ProducerConfig{
		Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll,
		CallbackListen: "127.0.0.1:0", CallbackAdvertise: "orders-7.internal:7430",
	})
	require.Equal(t, "orders-7.internal:7430", p.CallbackAddr())

	wildcard := newTestProducer(t, ProducerConfig{
		Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll, CallbackListen: ":0",
	})
	host, _, err := net.SplitHostPort(wildcard.CallbackAddr())
	require.NoError(t, err)
	want, err := os.Hostname()
	require.NoError(t, err)
	require.Equal(t, want, host, "a wildcard listen address is advertised by host name")
}

func TestHeartbeatNotFoundRegistersAgain(t *testing.T) {
	var forgotten atomic.Bool
	f := &fakeProducer{}
	f.heartbeat = func(context.Context, *txmqv1.HeartbeatRequest) (*txmqv1.HeartbeatResponse, error) {
		// The first heartbeat reaches a new leader that never heard of the
		// instance.
		if forgotten.CompareAndSwap(false, true) {
			return nil, status.Error(codes.NotFound, "producer instance orders-1 is not registered")
		}
		return &txmqv1.HeartbeatResponse{}, nil
	}
	newTestProducer(t, ProducerConfig{
		Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", InstanceID: "orders-1", Checker: commitAll,
	})

	waitFor(t, "a second registration and heartbeats after it", func() bool {
		calls := f.Calls()
		last := strings.Join(calls, "\n")
		i := strings.LastIndex(last, "RegisterProducer")
		return f.Count("RegisterProducer") == 2 && strings.Count(last[i:], "Heartbeat") >= 2
	})
	calls := f.Calls()
	require.Equal(t, []string{"RegisterProducer orders/orders-1", "Heartbeat orders/orders-1", "RegisterProducer orders/orders-1"}, calls[:3])
	regs := f.Registrations()
	require.Equal(t, regs[0].GetEndpoint().GetGrpcAddress(), regs[1].GetEndpoint().GetGrpcAddress())
}

func TestHeartbeatSurvivesUnavailable(t *testing.T) {
	var n atomic.Int32
	f := &fakeProducer{}
	f.heartbeat = func(context.Context, *txmqv1.HeartbeatRequest) (*txmqv1.HeartbeatResponse, error) {
		if n.Add(1) <= 3 {
			return nil, status.Error(codes.Unavailable, "no quorum")
		}
		return &txmqv1.HeartbeatResponse{}, nil
	}
	newTestProducer(t, ProducerConfig{
		Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", Checker: commitAll,
	})
	waitFor(t, "heartbeats after the broker recovered", func() bool { return n.Load() >= 6 })
	require.Equal(t, 1, f.Count("RegisterProducer"), "Unavailable is not a reason to register again")
}

func TestRegistrationFollowsLeader(t *testing.T) {
	leader := &fakeProducer{}
	refusal := notLeaderErr(t, startProducerServer(t, leader))
	follower := &fakeProducer{register: func(context.Context, *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
		return nil, refusal
	}}
	newTestProducer(t, ProducerConfig{
		Addrs: []string{startProducerServer(t, follower)}, ProducerGroup: "orders", InstanceID: "orders-1", Checker: commitAll,
	})
	require.Equal(t, 1, follower.Count("RegisterProducer"))
	require.Equal(t, 1, leader.Count("RegisterProducer"), "registered with the leader before NewProducer returned")
	waitFor(t, "heartbeats to the leader", func() bool { return leader.Count("Heartbeat") >= 2 })
	require.Zero(t, follower.Count("Heartbeat"))
}

func TestProducerStartsBeforeBroker(t *testing.T) {
	addr := deadAddr(t)
	p := newTestProducer(t, ProducerConfig{
		Addrs: []string{addr}, ProducerGroup: "orders", InstanceID: "orders-1", Checker: commitAll,
		RetryTimeout: 100 * time.Millisecond,
	})
	require.Empty(t, p.CallbackAddr(), "no port is opened while the broker's sessions may carry the check-backs")

	// The broker that comes up has no sessions: the producer falls back to
	// a check-back server of its own.
	f := &fakeProducer{}
	startServer(t, addr, func(s *grpc.Server) { txmqv1.RegisterProducerServiceServer(s, f) })
	waitFor(t, "registration once the broker is up", func() bool { return f.Count("RegisterProducer") >= 1 })
	waitFor(t, "heartbeats", func() bool { return f.Count("Heartbeat") >= 1 })
	require.NotEmpty(t, p.CallbackAddr())
	require.Equal(t, p.CallbackAddr(), f.Registrations()[0].GetEndpoint().GetGrpcAddress())
}

func TestRegistrationRefusedAsInvalid(t *testing.T) {
	f := &fakeProducer{register: func(context.Context, *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
		return nil, status.Error(codes.InvalidArgument, "endpoint 127.0.0.1:1 is a loopback address")
	}}
	_, err := NewProducer(ProducerConfig{
		Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", Checker: commitAll, Logger: discardLogger,
	})
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Contains(t, err.Error(), "loopback")
}

func TestCloseStopsCheckBacks(t *testing.T) {
	var closed atomic.Bool
	f := &fakeProducer{}
	f.heartbeat = func(context.Context, *txmqv1.HeartbeatRequest) (*txmqv1.HeartbeatResponse, error) {
		if closed.Load() {
			t.Error("heartbeat after Close")
		}
		return &txmqv1.HeartbeatResponse{}, nil
	}
	p, err := NewProducer(ProducerConfig{
		Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", Checker: commitAll, Logger: discardLogger,
	})
	require.NoError(t, err)
	waitFor(t, "heartbeats", func() bool { return f.Count("Heartbeat") >= 2 })
	checker := dialChecker(t, p.CallbackAddr())
	_, err = checker.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{ProducerGroup: "orders", TransactionId: "tx-1"})
	require.NoError(t, err)

	require.NoError(t, p.Close())
	closed.Store(true)
	require.NoError(t, p.Close())

	_, err = net.Dial("tcp", p.CallbackAddr())
	require.Error(t, err, "the check-back server is closed")
	_, err = checker.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{ProducerGroup: "orders", TransactionId: "tx-1"})
	require.Equal(t, codes.Unavailable, status.Code(err))
	// Heartbeats were every 10 ms: several would have come by now.
	time.Sleep(20 * testHeartbeatInterval)
	_, err = p.Send(t.Context(), Message{Topic: "orders", Body: []byte("x")})
	require.ErrorIs(t, err, ErrClosed)
}

func TestCloseDrainsCheckBacks(t *testing.T) {
	started := make(chan struct{})
	release := make(chan struct{})
	checker := func(ctx context.Context, m HalfMessage) (Resolution, error) {
		close(started)
		<-release
		return Commit, nil
	}
	p, err := NewProducer(ProducerConfig{
		Addrs: []string{startProducerServer(t, &fakeProducer{})}, ProducerGroup: "orders", Checker: checker, Logger: discardLogger,
	})
	require.NoError(t, err)
	client := dialChecker(t, p.CallbackAddr())
	answered := make(chan error, 1)
	go func() {
		resp, err := client.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{ProducerGroup: "orders", TransactionId: "tx-1"})
		if err == nil && resp.GetResolution() != txmqv1.Resolution_RESOLUTION_COMMIT {
			err = errors.New("wrong resolution " + resp.GetResolution().String())
		}
		answered <- err
	}()
	<-started
	closeDone := make(chan error, 1)
	go func() { closeDone <- p.Close() }()
	waitFor(t, "Close to stop taking check-backs", func() bool {
		conn, err := net.Dial("tcp", p.CallbackAddr())
		if err == nil {
			_ = conn.Close()
		}
		return err != nil
	})
	select {
	case err := <-closeDone:
		t.Fatalf("Close returned (%v) with a check-back in progress", err)
	default:
	}
	close(release)
	require.NoError(t, <-answered, "a check-back in progress finishes")
	require.NoError(t, <-closeDone)
}

func TestCheckTransaction(t *testing.T) {
	created := time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.UTC)
	var (
		mu  sync.Mutex
		got []HalfMessage
	)
	checker := func(ctx context.Context, m HalfMessage) (Resolution, error) {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		switch m.TransactionID {
		case "commit":
			return Commit, nil
		case "rollback":
			return Rollback, nil
		case "unknown":
			return Unknown, nil
		case "error":
			return Commit, errors.New("db: connection refused")
		case "panic":
			panic("nil map")
		case "invalid":
			return Resolution(9), nil
		case "deadline":
			if _, ok := ctx.Deadline(); !ok {
				return Unknown, errors.New("no deadline")
			}
			<-ctx.Done()
			return Unknown, ctx.Err()
		}
		return Unknown, errors.New("unexpected transaction " + m.TransactionID)
	}
	p := newTestProducer(t, ProducerConfig{
		Addrs: []string{startProducerServer(t, &fakeProducer{})}, ProducerGroup: "orders", Checker: checker,
	})
	client := dialChecker(t, p.CallbackAddr())
	check := func(ctx context.Context, txID string) (txmqv1.Resolution, error) {
		resp, err := client.CheckTransaction(ctx, &txmqv1.CheckTransactionRequest{ProducerGroup: "orders", TransactionId: txID})
		return resp.GetResolution(), err
	}

	for txID, want := range map[string]txmqv1.Resolution{
		"commit":   txmqv1.Resolution_RESOLUTION_COMMIT,
		"rollback": txmqv1.Resolution_RESOLUTION_ROLLBACK,
		"unknown":  txmqv1.Resolution_RESOLUTION_UNKNOWN,
	} {
		res, err := check(t.Context(), txID)
		require.NoError(t, err, txID)
		require.Equal(t, want, res, txID)
	}

	_, err := check(t.Context(), "error")
	require.Equal(t, codes.Unknown, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "db: connection refused")

	_, err = check(t.Context(), "invalid")
	require.Equal(t, codes.Unknown, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "Resolution(9)")

	_, err = check(t.Context(), "panic")
	require.Equal(t, codes.Internal, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), "nil map")
	res, err := check(t.Context(), "commit")
	require.NoError(t, err, "the server survives a panicking checker")
	require.Equal(t, txmqv1.Resolution_RESOLUTION_COMMIT, res)

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = check(ctx, "deadline")
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "the checker's ctx ends with the broker's call")

	t.Run("fields reach the checker", func(t *testing.T) {
		body := []byte{0, 1, 2, 0xff}
		_, err := client.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{
			MessageId: "01HX", Topic: "order-events", ProducerGroup: "orders", TransactionId: "commit",
			Key: "order-42", Properties: map[string]string{"k": "v"}, Body: body, Attempt: 3,
			CreatedAt: timestamppb.New(created),
		})
		require.NoError(t, err)
		mu.Lock()
		last := got[len(got)-1]
		mu.Unlock()
		require.Equal(t, HalfMessage{
			MessageID: "01HX", Topic: "order-events", ProducerGroup: "orders", TransactionID: "commit",
			Key: "order-42", Properties: map[string]string{"k": "v"}, Body: body, Attempt: 3,
		}, HalfMessage{
			MessageID: last.MessageID, Topic: last.Topic, ProducerGroup: last.ProducerGroup, TransactionID: last.TransactionID,
			Key: last.Key, Properties: last.Properties, Body: last.Body, Attempt: last.Attempt,
		})
		require.True(t, created.Equal(last.CreatedAt), "created_at: %v", last.CreatedAt)
	})

	t.Run("largest message", func(t *testing.T) {
		body := bytes.Repeat([]byte("x"), 4<<20)
		_, err := client.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{
			ProducerGroup: "orders", TransactionId: "commit", Body: body,
		})
		require.NoError(t, err)
		mu.Lock()
		n := len(got[len(got)-1].Body)
		mu.Unlock()
		require.Equal(t, len(body), n)
	})

	t.Run("refused without calling the checker", func(t *testing.T) {
		mu.Lock()
		before := len(got)
		mu.Unlock()
		_, err := client.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{ProducerGroup: "billing", TransactionId: "commit"})
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "another group's check-back")
		require.Contains(t, status.Convert(err).Message(), `"billing"`)
		_, err = client.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{TransactionId: "commit"})
		require.Equal(t, codes.FailedPrecondition, status.Code(err), "no group")
		_, err = client.CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{ProducerGroup: "orders"})
		require.Equal(t, codes.InvalidArgument, status.Code(err), "no transaction ID")
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, before)
	})
}

func TestCallbackURL(t *testing.T) {
	f := &fakeProducer{}
	p := newTestProducer(t, ProducerConfig{
		Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", Checker: commitAll,
		CallbackURL: "https://orders-1.internal/txmq/check",
	})
	require.Equal(t, "https://orders-1.internal/txmq/check", p.CallbackAddr())
	regs := f.Registrations()
	require.Len(t, regs, 1)
	require.Equal(t, "https://orders-1.internal/txmq/check", regs[0].GetEndpoint().GetHttpUrl())
	require.Empty(t, regs[0].GetEndpoint().GetGrpcAddress())
}

func TestNewProducerValidatesCheckBackConfig(t *testing.T) {
	addr := startProducerServer(t, &fakeProducer{})
	for name, cfg := range map[string]ProducerConfig{
		"checker without group":      {Checker: commitAll},
		"listen without checker":     {ProducerGroup: "orders", CallbackListen: "127.0.0.1:0"},
		"advertise without checker":  {ProducerGroup: "orders", CallbackAdvertise: "orders-1:7430"},
		"URL without checker":        {ProducerGroup: "orders", CallbackURL: "http://orders-1/check"},
		"advertise without port":     {ProducerGroup: "orders", Checker: commitAll, CallbackAdvertise: "orders-1"},
		"advertise port 0":           {ProducerGroup: "orders", Checker: commitAll, CallbackAdvertise: "orders-1:0"},
		"advertise without host":     {ProducerGroup: "orders", Checker: commitAll, CallbackAdvertise: ":7430"},
		"bad instance ID":            {ProducerGroup: "orders", Checker: commitAll, InstanceID: "orders 1"},
		"URL not http":               {ProducerGroup: "orders", Checker: commitAll, CallbackURL: "grpc://orders-1:7430"},
		"URL relative":               {ProducerGroup: "orders", Checker: commitAll, CallbackURL: "/txmq/check"},
		"URL and listen":             {ProducerGroup: "orders", Checker: commitAll, CallbackURL: "http://orders-1/check", CallbackListen: ":0"},
		"checker and negative retry": {ProducerGroup: "orders", Checker: commitAll, RetryTimeout: -1},
	} {
		t.Run(name, func(t *testing.T) {
			cfg.Addrs = []string{addr}
			_, err := NewProducer(cfg)
			require.ErrorIs(t, err, ErrInvalidArgument)
		})
	}

	for name, listen := range map[string]string{
		"not an address": "nowhere",
		"bad port":       "127.0.0.1:99999",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewProducer(ProducerConfig{
				Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll, CallbackListen: listen, Logger: discardLogger,
			})
			require.Error(t, err)
			require.Contains(t, err.Error(), "CallbackListen")
		})
	}
	t.Run("address in use", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll})
		_, err := NewProducer(ProducerConfig{
			Addrs: []string{addr}, ProducerGroup: "orders", Checker: commitAll, CallbackListen: p.CallbackAddr(), Logger: discardLogger,
		})
		require.Error(t, err)
	})
}

func TestCheckHandler(t *testing.T) {
	var got HalfMessage
	h := CheckHandler(func(ctx context.Context, m HalfMessage) (Resolution, error) {
		got = m
		switch m.TransactionID {
		case "commit":
			return Commit, nil
		case "rollback":
			return Rollback, nil
		case "error":
			return Unknown, errors.New("db: connection refused")
		case "panic":
			panic("nil map")
		}
		return Unknown, nil
	})
	serve := func(method, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "/txmq/check", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	requireJSON := func(t *testing.T, w *httptest.ResponseRecorder, code int, body string) {
		t.Helper()
		require.Equal(t, code, w.Code)
		require.Equal(t, "application/json", w.Header().Get("Content-Type"))
		require.JSONEq(t, body, w.Body.String())
	}

	for txID, want := range map[string]string{"commit": "commit", "rollback": "rollback", "later": "unknown"} {
		w := serve(http.MethodPost, `{"producer_group":"orders","transaction_id":"`+txID+`","attempt":1}`)
		requireJSON(t, w, http.StatusOK, `{"resolution":"`+want+`"}`)
	}

	t.Run("fields and a binary body", func(t *testing.T) {
		w := serve(http.MethodPost, `{"message_id":"01HX","topic":"order-events","producer_group":"orders",`+
			`"transaction_id":"commit","key":"order-42","properties":{"k":"v"},"body_base64":"AAH//g==",`+
			`"attempt":2,"created_at":"2026-05-01T10:00:00.123456789Z","unknown_field":true}`)
		requireJSON(t, w, http.StatusOK, `{"resolution":"commit"}`)
		require.Equal(t, "01HX", got.MessageID)
		require.Equal(t, "order-events", got.Topic)
		require.Equal(t, "orders", got.ProducerGroup)
		require.Equal(t, "order-42", got.Key)
		require.Equal(t, map[string]string{"k": "v"}, got.Properties)
		require.Equal(t, []byte{0, 1, 0xff, 0xfe}, got.Body)
		require.Equal(t, uint32(2), got.Attempt)
		require.True(t, time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.UTC).Equal(got.CreatedAt), "created_at: %v", got.CreatedAt)
	})

	t.Run("checker error", func(t *testing.T) {
		w := serve(http.MethodPost, `{"transaction_id":"error"}`)
		requireJSON(t, w, http.StatusInternalServerError, `{"error":"db: connection refused"}`)
	})
	t.Run("checker panic", func(t *testing.T) {
		w := serve(http.MethodPost, `{"transaction_id":"panic"}`)
		require.Equal(t, http.StatusInternalServerError, w.Code)
		require.Contains(t, w.Body.String(), "nil map")
	})
	t.Run("not POST", func(t *testing.T) {
		for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodHead} {
			w := serve(m, "")
			require.Equal(t, http.StatusMethodNotAllowed, w.Code, m)
			require.Equal(t, http.MethodPost, w.Header().Get("Allow"))
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		for name, body := range map[string]string{
			"not JSON":       `resolution please`,
			"empty":          ``,
			"truncated":      `{"transaction_id":"commit"`,
			"two objects":    `{"transaction_id":"commit"} {}`,
			"wrong type":     `{"transaction_id":"commit","attempt":"one"}`,
			"bad base64":     `{"transaction_id":"commit","body_base64":"not base64!"}`,
			"bad created_at": `{"transaction_id":"commit","created_at":"yesterday"}`,
			"no tx ID":       `{"message_id":"01HX"}`,
		} {
			w := serve(http.MethodPost, body)
			require.Equal(t, http.StatusBadRequest, w.Code, name)
			require.Contains(t, w.Body.String(), `"error"`, name)
		}
	})
	t.Run("over the size limit", func(t *testing.T) {
		w := serve(http.MethodPost, `{"transaction_id":"commit","body_base64":"`+strings.Repeat("A", checkhttp.MaxRequestSize)+`"}`)
		require.Equal(t, http.StatusRequestEntityTooLarge, w.Code)
	})
	t.Run("over a real server", func(t *testing.T) {
		srv := httptest.NewServer(h)
		defer srv.Close()
		resp, err := http.Post(srv.URL, "application/json", strings.NewReader(`{"transaction_id":"rollback"}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var buf bytes.Buffer
		_, err = buf.ReadFrom(resp.Body)
		require.NoError(t, err)
		require.JSONEq(t, `{"resolution":"rollback"}`, buf.String())
	})
	require.Panics(t, func() { CheckHandler(nil) })
}

// The broker's HTTP caller and CheckHandler speak the same contract: every
// field of the check-back arrives, created_at to the nanosecond, and the
// answer comes back.
func TestCheckHandlerAnswersTheBrokersCaller(t *testing.T) {
	created := time.Date(2026, 5, 1, 10, 0, 0, 123456789, time.UTC)
	var got HalfMessage
	srv := httptest.NewServer(CheckHandler(func(_ context.Context, m HalfMessage) (Resolution, error) {
		got = m
		return Rollback, nil
	}))
	defer srv.Close()
	caller := checkback.NewNetCaller(nil)
	defer caller.Close()

	res, err := caller.Check(t.Context(), checkback.Endpoint{HTTP: srv.URL + "/txmq/check"}, &txmqv1.CheckTransactionRequest{
		MessageId: "01HX", Topic: "order-events", ProducerGroup: "orders", TransactionId: "order-42:paid",
		Key: "order-42", Properties: map[string]string{"k": "v"}, Body: []byte{0, 1, 0xff}, Attempt: 3,
		CreatedAt: timestamppb.New(created),
	})
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_ROLLBACK, res)
	require.Equal(t, HalfMessage{
		MessageID: "01HX", Topic: "order-events", ProducerGroup: "orders", TransactionID: "order-42:paid",
		Key: "order-42", Properties: map[string]string{"k": "v"}, Body: []byte{0, 1, 0xff}, Attempt: 3,
		CreatedAt: created,
	}, got)
}

// oldSessions is a broker whose sessions carry writes only: a register
// request ends the session with InvalidArgument, as brokers from before
// check-backs on sessions do.
type oldSessions struct{ *fakeProducer }

func (o oldSessions) Session(stream txmqv1.ProducerService_SessionServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	return status.Errorf(codes.InvalidArgument, "session request %d has no send, send_half or end_transaction", req.GetId())
}

// A broker whose sessions know no registration gets a check-back server
// instead, registered by address, as before.
func TestCheckBacksFallBackFromOldSessions(t *testing.T) {
	f := &fakeProducer{}
	_, addr := startServer(t, "127.0.0.1:0", func(s *grpc.Server) { txmqv1.RegisterProducerServiceServer(s, oldSessions{f}) })
	p := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, ProducerGroup: "orders", InstanceID: "orders-1", Checker: commitAll})
	require.NotEmpty(t, p.CallbackAddr(), "a check-back server")
	regs := f.Registrations()
	require.Len(t, regs, 1)
	require.Equal(t, p.CallbackAddr(), regs[0].GetEndpoint().GetGrpcAddress())
	resp, err := dialChecker(t, p.CallbackAddr()).CheckTransaction(t.Context(), &txmqv1.CheckTransactionRequest{ProducerGroup: "orders", TransactionId: "tx-1"})
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_COMMIT, resp.GetResolution())
}
