package txmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// Resolution is a Checker's answer: what became of the local transaction
// behind a half message.
type Resolution int

const (
	// Unknown: the outcome is not known yet, e.g. the local transaction may
	// still be running. The broker asks again later, with backoff, until the
	// message's checks are used up or it is too old; then it expires.
	Unknown Resolution = iota
	// Commit: the local transaction committed. The broker commits the half
	// message and delivers it.
	Commit
	// Rollback: the local transaction rolled back, or never ran and never
	// can. The broker discards the half message.
	Rollback
)

func (r Resolution) String() string {
	switch r {
	case Unknown:
		return "unknown"
	case Commit:
		return "commit"
	case Rollback:
		return "rollback"
	}
	return fmt.Sprintf("Resolution(%d)", int(r))
}

func (r Resolution) proto() txmqv1.Resolution {
	switch r {
	case Commit:
		return txmqv1.Resolution_RESOLUTION_COMMIT
	case Rollback:
		return txmqv1.Resolution_RESOLUTION_ROLLBACK
	}
	return txmqv1.Resolution_RESOLUTION_UNKNOWN
}

// HalfMessage is the half message a check-back asks about.
type HalfMessage struct {
	MessageID     string
	Topic         string
	ProducerGroup string
	// TransactionID is the ID the producer sent the half message under: the
	// key to look the local transaction up by.
	TransactionID string
	Key           string
	// Properties and Body belong to the Checker.
	Properties map[string]string
	Body       []byte
	// Attempt is 1 on the first check-back of the message, then 2, 3, ...
	Attempt uint32
	// CreatedAt is when the broker's leader stored the half message, by the
	// leader's clock.
	CreatedAt time.Time
}

// halfMessage is the half message a check-back, by gRPC or HTTP, asks about.
func halfMessage(req *txmqv1.CheckTransactionRequest) HalfMessage {
	m := HalfMessage{
		MessageID:     req.GetMessageId(),
		Topic:         req.GetTopic(),
		ProducerGroup: req.GetProducerGroup(),
		TransactionID: req.GetTransactionId(),
		Key:           req.GetKey(),
		Properties:    req.GetProperties(),
		Body:          req.GetBody(),
		Attempt:       req.GetAttempt(),
	}
	if ts := req.GetCreatedAt(); ts != nil {
		m.CreatedAt = ts.AsTime()
	}
	return m
}

// Checker answers a check-back: did the local transaction behind m commit?
// The broker calls it, through the producer, when a half message stayed
// pending past its check-after time, typically because the producer died
// between its local commit and Commit.
//
// The answer must come from the database the local transaction wrote, read
// after that transaction's commit, on the primary: never from a cache, a
// Redis flag, a read replica that may lag, or a flag written before the
// local transaction committed. Such a copy can say "committed" for a
// transaction that rolled back, and the broker then delivers a message for
// something that never happened. (This is how an order service once handed
// out loyalty points for orders that did not exist: its check-back read a
// cache flag set right after SendHalf, and the rollback never cleared it.)
//
// The pattern that works is a transaction-log table in the business
// database. The local transaction inserts a row (tx_id PRIMARY KEY, status)
// in the same database transaction as its business change, so the row exists
// exactly when the change committed. The Checker then runs
//
//	SELECT 1 FROM tx_log WHERE tx_id = ?
//
// and answers
//   - Commit when the row is there;
//   - Rollback when it is not and the half message is older than the
//     longest the local transaction can take (bound the local transaction
//     with a timeout, and leave a margin for clock skew): e.g.
//     m.CreatedAt + 1 min < now;
//   - Unknown otherwise: the local transaction may still commit.
//
// A late local transaction that outlives its bound could still commit after
// a Rollback answer. To rule that out, the Checker can insert the row itself
// with status 'rolled_back' before it answers Rollback: the primary key then
// makes the late local transaction fail. The Checker must then answer from
// the row's status (SELECT status ...), not from its mere presence. See
// ExampleChecker.
//
// Returning an error counts like Unknown: the broker asks again later. A
// panic is recovered and reported as an error. ctx ends when the broker's
// call does. A Checker must be safe for concurrent use: check-backs of
// different messages, and a repeat of a check that timed out, may overlap.
type Checker func(ctx context.Context, m HalfMessage) (Resolution, error)

// panicError is a Checker's panic turned into an error.
type panicError struct{ v any }

func (e *panicError) Error() string { return fmt.Sprintf("txmq: checker panicked: %v", e.v) }

// runChecker calls c, turning a panic and an out-of-range answer into errors.
func runChecker(ctx context.Context, c Checker, m HalfMessage, log *slog.Logger) (res Resolution, err error) {
	defer func() {
		if v := recover(); v != nil {
			log.Error("checker panicked", "msg_id", m.MessageID, "tx_id", m.TransactionID,
				"panic", v, "stack", string(debug.Stack()))
			res, err = Unknown, &panicError{v: v}
		}
	}()
	res, err = c(ctx, m)
	if err != nil {
		return Unknown, err
	}
	if res != Unknown && res != Commit && res != Rollback {
		return Unknown, fmt.Errorf("txmq: checker returned %v, which is not Unknown, Commit or Rollback", res)
	}
	return res, nil
}

// checkServer serves txmqv1.TransactionChecker for one producer group.
type checkServer struct {
	txmqv1.UnimplementedTransactionCheckerServer
	group   string
	checker Checker
	log     *slog.Logger
}

func (s *checkServer) CheckTransaction(ctx context.Context, req *txmqv1.CheckTransactionRequest) (*txmqv1.CheckTransactionResponse, error) {
	res, err := answerCheck(ctx, s.group, s.checker, req, s.log)
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		code := codes.Unknown
		if _, ok := errors.AsType[*panicError](err); ok {
			code = codes.Internal
		}
		return nil, status.Error(code, err.Error())
	}
	return &txmqv1.CheckTransactionResponse{Resolution: res.proto()}, nil
}

// answerCheck runs the Checker of group for a check-back that came by gRPC
// or on the producer's session. A refusal of the request is a status error.
func answerCheck(ctx context.Context, group string, c Checker, req *txmqv1.CheckTransactionRequest, log *slog.Logger) (Resolution, error) {
	// The address of a dead instance may be reused by an instance of another
	// group; its database knows nothing of this transaction and would answer
	// Rollback for a committed one.
	if g := req.GetProducerGroup(); g != group {
		return Unknown, status.Errorf(codes.FailedPrecondition,
			"this instance serves producer group %q, not %q", group, g)
	}
	if req.GetTransactionId() == "" {
		return Unknown, status.Error(codes.InvalidArgument, "transaction_id is empty")
	}
	m := halfMessage(req)
	log = log.With("msg_id", m.MessageID, "tx_id", m.TransactionID, "attempt", m.Attempt)
	res, err := runChecker(ctx, c, m, log)
	if err != nil {
		log.Warn("check-back failed; the broker will ask again", "err", err)
		return Unknown, err
	}
	log.Info("check-back answered", "resolution", res)
	return res, nil
}
