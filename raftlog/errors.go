package raftlog

import (
	"errors"
	"fmt"
)

// ErrNotLeader is returned (wrapped in a *NotLeaderError) by calls that only
// the leader can serve.
var ErrNotLeader = errors.New("not the leader")

// ErrShutdown: the node is closed.
var ErrShutdown = errors.New("raftlog: node is shut down")

// Errors of membership and maintenance calls.
var (
	// ErrNotMember: no server of that ID is in the configuration.
	ErrNotMember = errors.New("not a member of the cluster")
	// ErrIsLeader: leadership cannot move to the node that has it.
	ErrIsLeader = errors.New("already the leader")
	// ErrSnapshot: a snapshot could not be taken (nothing new since the
	// last one, or one is being taken).
	ErrSnapshot = errors.New("snapshot not taken")
)

// NotLeaderError names the current leader, if one is known.
type NotLeaderError struct {
	LeaderID       string
	LeaderRaftAddr string
	// Unknown is set when the proposal may or may not have been committed
	// (leadership was lost while it was in flight). Retrying with the same
	// transaction ID or key is safe either way.
	Unknown bool
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == "" {
		return "not the leader, and no leader is known (election in progress or no quorum)"
	}
	return fmt.Sprintf("not the leader; the leader is %s at %s", e.LeaderID, e.LeaderRaftAddr)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }

// ErrRefused is matched (errors.Is) by every refusal of a command by the
// state machine; the error itself also matches the store's sentinel that
// says why (halfstore.ErrConflict, ErrNotFound, ...).
var ErrRefused = errors.New("raftlog: command refused by the state machine")

type refusal struct{ err error }

func (r refusal) Error() string        { return r.err.Error() }
func (r refusal) Unwrap() error        { return r.err }
func (r refusal) Is(target error) bool { return target == ErrRefused }

// ErrUnknownCommand: a log entry holds no command this version knows (an
// empty command, or one written by a newer txmq). Every node of the same
// version refuses it alike.
var ErrUnknownCommand = errors.New("raftlog: unknown command")
