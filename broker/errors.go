package broker

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog"
)

// toStatus is the one place where errors become gRPC status codes
// (SEMANTICS.md, Errors).
func (b *Broker) toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
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
	case errors.Is(err, raftlog.ErrShutdown):
		return status.Error(codes.Unavailable, "broker is shutting down; retry on another node")
	case errors.Is(err, halfstore.ErrClosed):
		return status.Error(codes.Unavailable, "broker is shutting down; retry on another node")
	case errors.Is(err, halfstore.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, halfstore.ErrConflict), errors.Is(err, halfstore.ErrExpired):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, halfstore.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	b.log.Error("internal error", "err", err)
	return status.Error(codes.Internal, err.Error())
}

// notLeaderStatus is Unavailable with a NotLeader detail naming the leader.
func (b *Broker) notLeaderStatus(nl *raftlog.NotLeaderError) error {
	msg := nl.Error() + "; retry on the leader (retrying with the same transaction ID or key is safe)"
	st := status.New(codes.Unavailable, msg)
	detail := &txmqv1.NotLeader{LeaderId: nl.LeaderID}
	if nl.LeaderID != "" {
		detail.LeaderAddress = b.nodeAddr(nl.LeaderID)
	}
	if withDetail, err := st.WithDetails(detail); err == nil {
		st = withDetail
	}
	return st.Err()
}

func invalid(msg string) error { return status.Error(codes.InvalidArgument, msg) }
