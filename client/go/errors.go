package txmq

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sentinels for the broker's refusals (docs/semantics.md, Errors). Errors returned
// by this package match them with errors.Is and carry the broker's message.
var (
	// ErrInvalidArgument: a bad topic or group name, an empty or oversized
	// body, a duration out of range, a missing transaction ID.
	ErrInvalidArgument = errors.New("txmq: invalid argument")
	// ErrNotFound: an unknown message ID, transaction, topic or group.
	ErrNotFound = errors.New("txmq: not found")
	// ErrConflict (gRPC FailedPrecondition): the half message already has the
	// opposite resolution, or it expired and only an operator may resolve it
	// (the message names the current state); or a transaction ID or key was
	// repeated with another message (the message names the first one).
	ErrConflict = errors.New("txmq: conflict")
	// ErrUnavailable: no leader or no quorum, after the client's retries.
	// When a context's end stopped them, the error matches the context's
	// error too.
	ErrUnavailable = errors.New("txmq: unavailable")
	// ErrResourceExhausted: over a size or rate limit.
	ErrResourceExhausted = errors.New("txmq: resource exhausted")
	// ErrUnauthenticated: missing credentials.
	ErrUnauthenticated = errors.New("txmq: unauthenticated")
	// ErrPermissionDenied: insufficient credentials.
	ErrPermissionDenied = errors.New("txmq: permission denied")
	// ErrCommitPending is returned by Producer.SendInTransaction when the
	// local transaction committed but the broker could not be told. The half
	// message stays pending and check-back resolves it from the local
	// database, so the caller may treat the transaction as done: delivery
	// will follow.
	ErrCommitPending = errors.New("txmq: commit pending")
	// ErrOutcomeUnknown is for a local transaction to return (wrapped) from
	// SendInTransaction's localTx when it cannot tell whether it committed:
	// the database's COMMIT failed on the way back (a lost connection), so
	// the change may or may not be there. The half message is then left
	// pending, neither committed nor rolled back, and check-back asks the
	// database, which knows. RocketMQ's UNKNOW.
	ErrOutcomeUnknown = errors.New("txmq: local transaction outcome unknown")
	// ErrClosed: the Producer or Consumer was closed.
	ErrClosed = errors.New("txmq: closed")
)

var codeSentinels = map[codes.Code]error{
	codes.InvalidArgument:    ErrInvalidArgument,
	codes.NotFound:           ErrNotFound,
	codes.FailedPrecondition: ErrConflict,
	codes.Unavailable:        ErrUnavailable,
	codes.ResourceExhausted:  ErrResourceExhausted,
	codes.Unauthenticated:    ErrUnauthenticated,
	codes.PermissionDenied:   ErrPermissionDenied,
	// gRPC turns the caller's context errors into these codes; mapping them
	// back keeps errors.Is(err, context.Canceled) working across the call.
	codes.Canceled:         context.Canceled,
	codes.DeadlineExceeded: context.DeadlineExceeded,
}

// statusError is a gRPC status translated to a sentinel. It keeps the
// status, so status.FromError still reaches the code and the details.
type statusError struct {
	kind error
	st   *status.Status
	// note, when set, says why the retries stopped.
	note string
	// cause is the caller's context error when that is what stopped them.
	cause error
}

func (e *statusError) Error() string {
	text := e.kind.Error()
	if e.kind == context.Canceled || e.kind == context.DeadlineExceeded {
		text = "txmq: " + text
	}
	// The client side reports a cancelled call with the context's own text;
	// repeating it adds nothing.
	if msg := e.st.Message(); msg != "" && msg != e.kind.Error() {
		text += ": " + msg
	}
	if e.note != "" {
		text += " (" + e.note + ")"
	}
	return text
}

func (e *statusError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.kind}
	}
	return []error{e.kind, e.cause}
}

// GRPCStatus lets status.FromError and status.Code see the original status.
func (e *statusError) GRPCStatus() *status.Status { return e.st }

// giveUp is the error of a call whose retries stopped after last, an
// Unavailable answer: it matches ErrUnavailable, and cause, the context's
// error, when that is what stopped them.
func giveUp(last *status.Status, note string, cause error) error {
	return &statusError{kind: ErrUnavailable, st: last, note: note, cause: cause}
}

// notRetried is the error of a request that is not safe to repeat and got
// an Unavailable answer after it went out. The note is in the status
// itself, so that whoever shows the status (brokerctl) shows it too.
func notRetried(st *status.Status) error {
	p := st.Proto()
	p.Message += " (not retried: the request may have taken effect)"
	return fromStatus(status.FromProto(p).Err())
}

// fromStatus translates an error returned by a gRPC call into one that
// matches this package's sentinels. Errors that carry no gRPC status pass
// through unchanged; codes without a sentinel are wrapped as they are.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	if kind, ok := codeSentinels[st.Code()]; ok {
		return &statusError{kind: kind, st: st}
	}
	return fmt.Errorf("txmq: %w", err)
}

// invalidf reports a bad argument found before any call to the broker.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
