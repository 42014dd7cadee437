package txmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func TestErrorMapping(t *testing.T) {
	cases := []struct {
		code codes.Code
		msg  string
		want error
		text string
	}{
		{codes.InvalidArgument, `topic "a b" does not match ^[A-Za-z0-9._-]{1,127}$`, ErrInvalidArgument, ""},
		{codes.NotFound, "message 01HX not found", ErrNotFound, ""},
		{codes.FailedPrecondition, "half message 01H.. is ROLLED_BACK, cannot commit", ErrConflict,
			"txmq: conflict: half message 01H.. is ROLLED_BACK, cannot commit"},
		// Unavailable is retried until RetryTimeout, which the text names.
		{codes.Unavailable, "no quorum", ErrUnavailable, "txmq: unavailable: no quorum (gave up after retrying for 100ms)"},
		{codes.ResourceExhausted, "body of 5 MiB is over the 4 MiB limit", ErrResourceExhausted, ""},
		{codes.Unauthenticated, "missing token", ErrUnauthenticated, ""},
		{codes.PermissionDenied, "token may not produce to orders", ErrPermissionDenied, ""},
	}
	for _, tc := range cases {
		t.Run(tc.code.String(), func(t *testing.T) {
			f := &fakeProducer{end: func(context.Context, *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
				return nil, status.Error(tc.code, tc.msg)
			}}
			p := newTestProducer(t, ProducerConfig{Addrs: []string{startProducerServer(t, f)}, RetryTimeout: 100 * time.Millisecond})

			err := p.Commit(t.Context(), "01H")
			require.ErrorIs(t, err, tc.want)
			require.Contains(t, err.Error(), tc.msg)
			if tc.text != "" {
				require.Equal(t, tc.text, err.Error())
			}
			require.Equal(t, tc.code, status.Code(err), "the gRPC status stays reachable")
		})
	}

	t.Run("unknown code", func(t *testing.T) {
		err := fromStatus(status.Error(codes.Internal, "bbolt: disk full"))
		require.Contains(t, err.Error(), "bbolt: disk full")
		require.Equal(t, codes.Internal, status.Code(err))
		for _, s := range []error{ErrInvalidArgument, ErrNotFound, ErrConflict, ErrUnavailable,
			ErrResourceExhausted, ErrUnauthenticated, ErrPermissionDenied} {
			require.NotErrorIs(t, err, s)
		}
	})
	t.Run("not a status", func(t *testing.T) {
		require.Same(t, ErrClosed, fromStatus(ErrClosed))
		require.NoError(t, fromStatus(nil))
	})
}

func TestContextErrorsSurviveTheCall(t *testing.T) {
	called := make(chan struct{}, 1)
	f := &fakeProducer{end: func(ctx context.Context, _ *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
		called <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	p := newTestProducer(t, ProducerConfig{Addrs: []string{startProducerServer(t, f)}})

	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err := p.Commit(ctx, "01H")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Cancel once the call is on the server (or at once, if the first call
	// reached it late: the result is the same).
	ctx, cancel = context.WithCancel(t.Context())
	go func() {
		<-called
		cancel()
	}()
	err = p.Commit(ctx, "01H")
	require.ErrorIs(t, err, context.Canceled)
}

func TestFollowsNotLeaderToLeader(t *testing.T) {
	leader := &fakeProducer{}
	refusal := notLeaderErr(t, startProducerServer(t, leader))
	follower := &fakeProducer{send: func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return nil, refusal
	}}
	p := newTestProducer(t, ProducerConfig{Addrs: []string{startProducerServer(t, follower)}})

	// No key: a follower's refusal is still safe to retry.
	res, err := p.Send(t.Context(), Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	require.Equal(t, SendResult{MessageID: "m-orders", Sequence: 7}, res)
	require.Equal(t, []string{"Send orders"}, follower.Calls())
	require.Equal(t, []string{"Send orders"}, leader.Calls())

	_, err = p.Send(t.Context(), Message{Topic: "orders", Body: []byte("y")})
	require.NoError(t, err)
	require.Len(t, follower.Calls(), 1, "the leader is remembered")
	require.Len(t, leader.Calls(), 2)
}

func TestUnavailableRotatesAddrs(t *testing.T) {
	down := &fakeProducer{
		send: func(context.Context, *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			return nil, status.Error(codes.Unavailable, "no quorum")
		},
		half: func(context.Context, *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
			return nil, status.Error(codes.Unavailable, "no quorum")
		},
	}
	up := &fakeProducer{}
	downAddr, upAddr := startProducerServer(t, down), startProducerServer(t, up)

	t.Run("keyed send", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{downAddr, upAddr}})
		_, err := p.Send(t.Context(), Message{Topic: "keyed", Key: "order-42", Body: []byte("x")})
		require.NoError(t, err)
		require.Contains(t, up.Calls(), "Send keyed")
	})
	t.Run("half message", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{downAddr, upAddr}, ProducerGroup: "orders"})
		id, err := p.SendHalf(t.Context(), "tx-1", Message{Topic: "orders", Body: []byte("x")})
		require.NoError(t, err)
		require.Equal(t, "h-tx-1", id)
		require.Contains(t, up.Calls(), "SendHalf orders/tx-1")
	})
	t.Run("keyless send that reached the broker is not retried", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{downAddr, upAddr}})
		_, err := p.Send(t.Context(), Message{Topic: "keyless", Body: []byte("x")})
		require.ErrorIs(t, err, ErrUnavailable)
		require.Contains(t, err.Error(), "not retried")
		require.NotContains(t, up.Calls(), "Send keyless")
	})
	t.Run("keyless send that found no broker is retried", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{deadAddr(t), upAddr}})
		_, err := p.Send(t.Context(), Message{Topic: "undelivered", Body: []byte("x")})
		require.NoError(t, err)
		require.Contains(t, up.Calls(), "Send undelivered")
	})
}

func TestRetryGivesUp(t *testing.T) {
	down := &fakeProducer{end: func(context.Context, *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
		return nil, status.Error(codes.Unavailable, "no quorum")
	}}
	addr := startProducerServer(t, down)

	t.Run("after RetryTimeout", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, RetryTimeout: 300 * time.Millisecond})
		before := len(down.Calls())
		err := p.Commit(t.Context(), "01H")
		require.ErrorIs(t, err, ErrUnavailable)
		require.Contains(t, err.Error(), "no quorum")
		require.Greater(t, len(down.Calls())-before, 1, "retried")
	})
	t.Run("when ctx ends", func(t *testing.T) {
		p := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, RetryTimeout: time.Hour})
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		err := p.Commit(ctx, "01H")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorIs(t, err, ErrUnavailable, "the last answer is kept")
		require.Contains(t, err.Error(), "no quorum")
		require.Equal(t, codes.Unavailable, status.Code(err))
	})
}

func TestProducerValidatesBeforeCalling(t *testing.T) {
	f := &fakeProducer{}
	addr := startProducerServer(t, f)
	grouped := newTestProducer(t, ProducerConfig{Addrs: []string{addr}, ProducerGroup: "orders"})
	ungrouped := newTestProducer(t, ProducerConfig{Addrs: []string{addr}})
	ok := Message{Topic: "orders", Body: []byte("x")}
	ctx := t.Context()
	noTx := func(context.Context) error {
		t.Error("local transaction ran")
		return nil
	}

	calls := map[string]func() error{
		"send empty topic": func() error { _, err := grouped.Send(ctx, Message{Body: []byte("x")}); return err },
		"send bad topic":   func() error { _, err := grouped.Send(ctx, Message{Topic: "a b", Body: []byte("x")}); return err },
		"send empty body":  func() error { _, err := grouped.Send(ctx, Message{Topic: "orders"}); return err },
		"half without group": func() error {
			_, err := ungrouped.SendHalf(ctx, "tx-1", ok)
			return err
		},
		"half empty tx ID": func() error { _, err := grouped.SendHalf(ctx, "", ok); return err },
		"half empty topic": func() error { _, err := grouped.SendHalf(ctx, "tx-1", Message{Body: []byte("x")}); return err },
		"half check-after too short": func() error {
			_, err := grouped.SendHalf(ctx, "tx-1", ok, WithCheckAfter(500*time.Millisecond))
			return err
		},
		"half check-after too long": func() error {
			_, err := grouped.SendHalf(ctx, "tx-1", ok, WithCheckAfter(2*time.Hour))
			return err
		},
		"commit empty ID":          func() error { return grouped.Commit(ctx, "") },
		"rollback empty ID":        func() error { return grouped.Rollback(ctx, "") },
		"commitTx empty tx ID":     func() error { return grouped.CommitTx(ctx, "") },
		"rollbackTx without group": func() error { return ungrouped.RollbackTx(ctx, "tx-1") },
		"transaction empty tx ID": func() error {
			_, err := grouped.SendInTransaction(ctx, "", ok, noTx)
			return err
		},
		"transaction without group": func() error {
			_, err := ungrouped.SendInTransaction(ctx, "tx-1", ok, noTx)
			return err
		},
		"transaction nil func": func() error { _, err := grouped.SendInTransaction(ctx, "tx-1", ok, nil); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			require.ErrorIs(t, call(), ErrInvalidArgument)
		})
	}
	require.Empty(t, f.Calls(), "nothing reached the broker")

	for name, cfg := range map[string]ProducerConfig{
		"bad group":      {ProducerGroup: "orders service"},
		"long group":     {ProducerGroup: strings.Repeat("a", 128)},
		"empty address":  {Addrs: []string{""}},
		"negative retry": {RetryTimeout: -time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewProducer(cfg)
			require.ErrorIs(t, err, ErrInvalidArgument)
		})
	}
}

func TestProducerClosed(t *testing.T) {
	p, err := NewProducer(ProducerConfig{Addrs: []string{startProducerServer(t, &fakeProducer{})}, Logger: discardLogger})
	require.NoError(t, err)
	_, err = p.Send(t.Context(), Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close())
	_, err = p.Send(t.Context(), Message{Topic: "orders", Body: []byte("x")})
	require.ErrorIs(t, err, ErrClosed)
}

func TestSendHalfRequest(t *testing.T) {
	var got *txmqv1.SendHalfRequest
	f := &fakeProducer{half: func(_ context.Context, req *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
		got = req
		return &txmqv1.SendHalfResponse{MessageId: "01H"}, nil
	}}
	p := newTestProducer(t, ProducerConfig{Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders"})
	msg := Message{Topic: "order-events", Key: "order-42", Properties: map[string]string{"k": "v"}, Body: []byte("paid")}
	id, err := p.SendHalf(t.Context(), "order-42:paid", msg, WithCheckAfter(2*time.Second))
	require.NoError(t, err)
	require.Equal(t, "01H", id)
	require.Equal(t, "order-events", got.GetTopic())
	require.Equal(t, "orders", got.GetProducerGroup())
	require.Equal(t, "order-42:paid", got.GetTransactionId())
	require.Equal(t, "order-42", got.GetKey())
	require.Equal(t, map[string]string{"k": "v"}, got.GetProperties())
	require.Equal(t, []byte("paid"), got.GetBody())
	require.Equal(t, 2*time.Second, got.GetCheckAfter().AsDuration())

	require.NoError(t, p.CommitTx(t.Context(), "order-42:paid"))
	require.NoError(t, p.RollbackTx(t.Context(), "order-43:paid"))
	require.Equal(t, []string{
		"SendHalf orders/order-42:paid",
		"EndTransaction RESOLUTION_COMMIT tx:orders/order-42:paid",
		"EndTransaction RESOLUTION_ROLLBACK tx:orders/order-43:paid",
	}, f.Calls())
}

func TestOrderingKeyIsSent(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	note := func(k string) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, k)
	}
	f := &fakeProducer{
		send: func(_ context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			note("Send " + req.GetOrderingKey())
			return &txmqv1.SendResponse{MessageId: "m"}, nil
		},
		half: func(_ context.Context, req *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
			note("SendHalf " + req.GetOrderingKey())
			return &txmqv1.SendHalfResponse{MessageId: "h-" + req.GetTransactionId(), State: txmqv1.HalfState_HALF_STATE_PENDING}, nil
		},
	}
	p := newTestProducer(t, ProducerConfig{Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders"})
	msg := Message{Topic: "order-events", Body: []byte("paid"), OrderingKey: "order-42"}

	_, err := p.Send(t.Context(), msg)
	require.NoError(t, err)
	_, err = p.SendHalf(t.Context(), "order-42:paid", msg)
	require.NoError(t, err)
	_, err = p.SendInTransaction(t.Context(), "order-42:shipped", msg, func(context.Context) error { return nil })
	require.NoError(t, err)
	_, err = p.Send(t.Context(), Message{Topic: "order-events", Body: []byte("unordered")})
	require.NoError(t, err)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"Send order-42", "SendHalf order-42", "SendHalf order-42", "Send "}, keys)
}

func TestSendInTransaction(t *testing.T) {
	msg := Message{Topic: "order-events", Body: []byte("paid")}
	unavailable := func(context.Context, *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
		return nil, status.Error(codes.Unavailable, "no quorum")
	}
	halfIn := func(state txmqv1.HalfState) func(context.Context, *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
		return func(_ context.Context, req *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
			return &txmqv1.SendHalfResponse{MessageId: "h-" + req.GetTransactionId(), Duplicate: true, State: state}, nil
		}
	}
	setup := func(t *testing.T, f *fakeProducer) *Producer {
		return newTestProducer(t, ProducerConfig{
			Addrs: []string{startProducerServer(t, f)}, ProducerGroup: "orders", RetryTimeout: 200 * time.Millisecond,
		})
	}

	t.Run("commit after the local transaction", func(t *testing.T) {
		f := &fakeProducer{}
		p := setup(t, f)
		id, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error {
			require.Equal(t, []string{"SendHalf orders/tx-1"}, f.Calls(), "the half message is stored first")
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, "h-tx-1", id)
		require.Equal(t, []string{"SendHalf orders/tx-1", "EndTransaction RESOLUTION_COMMIT h-tx-1"}, f.Calls())
	})

	t.Run("rollback when the local transaction fails", func(t *testing.T) {
		f := &fakeProducer{}
		p := setup(t, f)
		localErr := errors.New("insufficient funds")
		id, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error { return localErr })
		require.ErrorIs(t, err, localErr)
		require.Equal(t, "h-tx-1", id)
		require.Equal(t, []string{"SendHalf orders/tx-1", "EndTransaction RESOLUTION_ROLLBACK h-tx-1"}, f.Calls())
	})

	t.Run("failed rollback still returns the local error", func(t *testing.T) {
		f := &fakeProducer{end: unavailable}
		p := setup(t, f)
		localErr := errors.New("insufficient funds")
		_, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error { return localErr })
		require.ErrorIs(t, err, localErr)
		require.NotErrorIs(t, err, ErrCommitPending)
		require.Contains(t, f.Calls(), "EndTransaction RESOLUTION_ROLLBACK h-tx-1")
	})

	t.Run("an unknown outcome leaves the message pending", func(t *testing.T) {
		f := &fakeProducer{}
		p := setup(t, f)
		lost := fmt.Errorf("commit: %w: connection reset", ErrOutcomeUnknown)
		id, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error { return lost })
		require.ErrorIs(t, err, ErrOutcomeUnknown)
		require.ErrorContains(t, err, "connection reset")
		require.NotErrorIs(t, err, ErrCommitPending)
		require.Equal(t, "h-tx-1", id)
		require.Equal(t, []string{"SendHalf orders/tx-1"}, f.Calls(), "neither committed nor rolled back")
	})

	t.Run("no local transaction when SendHalf fails", func(t *testing.T) {
		f := &fakeProducer{half: func(context.Context, *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
			return nil, status.Error(codes.ResourceExhausted, "body over 4 MiB")
		}}
		p := setup(t, f)
		ran := false
		id, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error {
			ran = true
			return nil
		})
		require.ErrorIs(t, err, ErrResourceExhausted)
		require.Empty(t, id)
		require.False(t, ran)
		require.Equal(t, []string{"SendHalf orders/tx-1"}, f.Calls())
	})

	t.Run("commit pending when the broker cannot be told", func(t *testing.T) {
		f := &fakeProducer{end: unavailable}
		p := setup(t, f)
		id, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrCommitPending)
		require.ErrorIs(t, err, ErrUnavailable)
		require.Contains(t, err.Error(), "no quorum")
		require.Equal(t, "h-tx-1", id)
	})

	t.Run("a commit conflict is not pending", func(t *testing.T) {
		f := &fakeProducer{end: func(context.Context, *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "half message h-tx-1 is ROLLED_BACK, cannot commit")
		}}
		p := setup(t, f)
		_, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error { return nil })
		require.ErrorIs(t, err, ErrConflict)
		require.NotErrorIs(t, err, ErrCommitPending)
	})

	t.Run("a repeat of a committed transaction does nothing", func(t *testing.T) {
		f := &fakeProducer{half: halfIn(txmqv1.HalfState_HALF_STATE_COMMITTED)}
		p := setup(t, f)
		id, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error {
			t.Error("local transaction ran again")
			return nil
		})
		require.NoError(t, err)
		require.Equal(t, "h-tx-1", id)
		require.Equal(t, []string{"SendHalf orders/tx-1"}, f.Calls())
	})

	t.Run("a repeat of a rolled-back transaction conflicts", func(t *testing.T) {
		f := &fakeProducer{half: halfIn(txmqv1.HalfState_HALF_STATE_ROLLED_BACK)}
		p := setup(t, f)
		_, err := p.SendInTransaction(t.Context(), "tx-1", msg, func(context.Context) error {
			t.Error("local transaction ran")
			return nil
		})
		require.ErrorIs(t, err, ErrConflict)
		require.Contains(t, err.Error(), "HALF_STATE_ROLLED_BACK")
		require.Equal(t, []string{"SendHalf orders/tx-1"}, f.Calls())
	})
}

// With debug logging on, each write says what it did, with the write's
// topic, IDs, state and sequence.
func TestDebugLinesOfTheWrites(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p, err := NewProducer(ProducerConfig{Addrs: []string{startProducerServer(t, &fakeProducer{})}, ProducerGroup: "shop", Logger: log})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Send(t.Context(), Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	id, err := p.SendHalf(t.Context(), "order-42", Message{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, p.Commit(t.Context(), id))
	out := buf.String()
	require.Regexp(t, `level=DEBUG msg=sent .*topic=orders msg_id=\S+ sequence=\d+ duplicate=false`, out)
	require.Regexp(t, `level=DEBUG msg="half message stored" .*topic=orders tx_id=order-42 msg_id=`+id+` duplicate=false state=HALF_STATE_PENDING`, out)
	require.Regexp(t, `level=DEBUG msg="half message resolved" .*msg_id=`+id+` state=HALF_STATE_COMMITTED sequence=\d+`, out)
}
