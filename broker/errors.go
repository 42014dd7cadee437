package broker

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/internal/diskio"
	"github.com/txmq/txmq/raftlog"
)

// Errors the broker itself raises. Handlers return plain errors; the
// interceptors (statusUnary, statusStream) turn each into a gRPC status in
// toStatus, the one map of errors to codes (docs/semantics.md, Errors).
var (
	// errInvalidArgument is matched by every refusal of a malformed
	// request (invalidf).
	errInvalidArgument = errors.New("invalid argument")
	// errDispatcherClosed: leadership moved or the broker is closing.
	errDispatcherClosed = errors.New("delivery stopped on this node")
	// errGroupReset: the consumer group's position was reset; its
	// subscribers subscribe again.
	errGroupReset = errors.New("consumer group reset")
	// errStreamBroken: the client's side of a stream failed.
	errStreamBroken = errors.New("stream broken")
	// errNoSuchCheck: a check answer names no check-back waiting on its
	// session.
	errNoSuchCheck = errors.New("no such check-back is waiting on this session")
	// errUnauthenticated: no credentials, a wrong or a revoked token, or a
	// certificate that names no principal (auth.go).
	errUnauthenticated = errors.New("unauthenticated")
	// errPermissionDenied: the rules do not let the principal do it.
	errPermissionDenied = errors.New("permission denied")
	// errLimited: the principal is over a rate or count limit (limits.go).
	errLimited = errors.New("over a limit")
)

// kindError is a refusal of a kind (one of the sentinels above) whose
// message is shown as it is.
type kindError struct {
	kind error
	msg  string
}

func (e kindError) Error() string        { return e.msg }
func (e kindError) Is(target error) bool { return target == e.kind }

// refusef is a refusal of the given kind with a message a person can act
// on.
func refusef(kind error, format string, args ...any) error {
	return kindError{kind, fmt.Sprintf(format, args...)}
}

// invalidError is a malformed request; its message is shown as it is.
type invalidError struct{ msg string }

func (e invalidError) Error() string        { return e.msg }
func (e invalidError) Is(target error) bool { return target == errInvalidArgument }

// invalidf is a refusal of a malformed request: InvalidArgument.
func invalidf(format string, args ...any) error {
	return invalidError{fmt.Sprintf(format, args...)}
}

// toStatus is the one place where errors become gRPC status codes.
func (b *Broker) toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		// Already a status: a stream error of gRPC's own.
		return err
	}
	var nl *raftlog.NotLeaderError
	switch {
	case errors.As(err, &nl):
		return b.notLeaderStatus(nl)
	case errors.Is(err, errDispatcherClosed):
		if id, addr := b.node.Leader(); id != b.node.ID() {
			return b.notLeaderStatus(&raftlog.NotLeaderError{LeaderID: id, LeaderRaftAddr: addr})
		}
		return status.Error(codes.Unavailable, "delivery stopped on this node (leadership change or shutdown); reconnect")
	case errors.Is(err, errGroupReset):
		return status.Error(codes.Unavailable, err.Error()+"; subscribe again")
	case errors.Is(err, diskio.ErrWrite):
		return status.Error(codes.Unavailable, fmt.Sprintf("node %s %s; it takes no writes until it can (nothing acknowledged is lost): retry later or on the leader; retrying with the same transaction ID or key is safe (%v)",
			b.node.ID(), diskio.Describe(err), err))
	case errors.Is(err, raftlog.ErrShutdown), errors.Is(err, halfstore.ErrClosed):
		return status.Error(codes.Unavailable, "broker is shutting down; retry on another node")
	case errors.Is(err, errInvalidArgument), errors.Is(err, halfstore.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, halfstore.ErrNotFound), errors.Is(err, raftlog.ErrNotMember):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, checkback.ErrUnknownInstance), errors.Is(err, errNoSuchCheck):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, halfstore.ErrConflict), errors.Is(err, halfstore.ErrExpired),
		errors.Is(err, checkback.ErrNotPending), errors.Is(err, checkback.ErrCheckRunning),
		errors.Is(err, raftlog.ErrIsLeader), errors.Is(err, raftlog.ErrSnapshot):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, errUnauthenticated):
		return status.Error(codes.Unauthenticated, err.Error())
	case errors.Is(err, errPermissionDenied):
		return status.Error(codes.PermissionDenied, err.Error())
	case errors.Is(err, errLimited):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, errStreamBroken), errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	b.log.Error("internal error", "err", err)
	return status.Error(codes.Internal, err.Error())
}

// notLeaderStatus is Unavailable with a NotLeader detail naming the leader.
// Both the detail and the message name the leader's gRPC address, the one
// a client can call: its Raft address is of no use to one.
func (b *Broker) notLeaderStatus(nl *raftlog.NotLeaderError) error {
	msg := nl.Error()
	detail := &txmqv1.NotLeader{LeaderId: nl.LeaderID}
	if nl.LeaderID != "" {
		detail.LeaderAddress = b.nodeAddr(nl.LeaderID)
		addr := detail.LeaderAddress
		if addr == "" {
			addr = "a gRPC address it has not announced yet"
		}
		msg = fmt.Sprintf("not the leader; the leader is %s at %s", nl.LeaderID, addr)
	}
	st := status.New(codes.Unavailable, msg+"; retry on the leader (retrying with the same transaction ID or key is safe)")
	if withDetail, err := st.WithDetails(detail); err == nil {
		st = withDetail
	}
	return st.Err()
}

// statusUnary makes every unary handler's error a status.
func (b *Broker) statusUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	return resp, b.toStatus(err)
}

// statusStream makes every stream handler's error a status.
func (b *Broker) statusStream(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return b.toStatus(handler(srv, ss))
}
