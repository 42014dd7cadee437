package raftlog

import (
	"context"
	"fmt"
	"time"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// The command vocabulary. Each call proposes one command, stamped with the
// leader's clock (now), and returns that command's result once a majority
// has it on disk and this node applied it. A command the state machine
// refuses (first resolution wins, unknown message, invalid) returns the
// refusal as the error: it is deterministic, every node refuses it alike.
// The apply side of each command is in apply.go, under the same name.

// SendResult is what a Send stored.
type SendResult struct {
	MessageID string
	Sequence  uint64
	// Duplicate: the key was sent within the dedup window; MessageID and
	// Sequence are the first message's and nothing was stored.
	Duplicate bool
}

// Send appends a plain message to its topic.
func (n *Node) Send(ctx context.Context, now time.Time, op *raftpb.Send) (SendResult, error) {
	return propose[SendResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Send{Send: op}})
}

// HalfResult is a half message as a command left it.
type HalfResult struct {
	Half *storepb.Half
	// Changed is false when the command found the message already as asked
	// (a repeated SendHalf, commit, rollback or expiry): nothing changed.
	Changed bool
}

// SendHalf stores a PENDING half message; a repeat of the producer group
// and transaction ID returns the first one unchanged.
func (n *Node) SendHalf(ctx context.Context, now time.Time, op *raftpb.SendHalf) (HalfResult, error) {
	return propose[HalfResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_SendHalf{SendHalf: op}})
}

// Resolve commits or rolls back a half message.
func (n *Node) Resolve(ctx context.Context, now time.Time, op *raftpb.Resolve) (HalfResult, error) {
	return propose[HalfResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Resolve{Resolve: op}})
}

// RecordCheck records a check-back that resolved nothing.
func (n *Node) RecordCheck(ctx context.Context, now time.Time, op *raftpb.RecordCheck) (HalfResult, error) {
	return propose[HalfResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_RecordCheck{RecordCheck: op}})
}

// Expire ends a half message whose checks are used up or that is too old.
func (n *Node) Expire(ctx context.Context, now time.Time, op *raftpb.Expire) (HalfResult, error) {
	return propose[HalfResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Expire{Expire: op}})
}

// TopicResult is a topic as CreateTopic left it.
type TopicResult struct {
	Topic   *storepb.Topic
	Created bool
}

// CreateTopic creates a topic unless it exists.
func (n *Node) CreateTopic(ctx context.Context, now time.Time, op *raftpb.CreateTopic) (TopicResult, error) {
	return propose[TopicResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_CreateTopic{CreateTopic: op}})
}

// GroupResult is a consumer group's progress on a topic after a command.
type GroupResult struct {
	Group *storepb.Group
	// Created: CreateGroup created the group (false: it existed).
	Created bool
	// DeadLetters are those a RecordFailures created.
	DeadLetters []*storepb.DeadLetter
}

// CreateGroup creates a consumer group on a topic unless it exists.
func (n *Node) CreateGroup(ctx context.Context, now time.Time, op *raftpb.CreateGroup) (GroupResult, error) {
	return propose[GroupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_CreateGroup{CreateGroup: op}})
}

// DeleteResult is what a DeleteTopic or a DeleteGroup deleted, as it was.
type DeleteResult struct {
	// Topic is the topic a DeleteTopic deleted.
	Topic *storepb.Topic
	// Groups are the consumer groups' progress deleted, one per topic,
	// with their lag.
	Groups []halfstore.DroppedGroup
	// Policy: a DeleteGroup deleted the group's delivery policy too.
	Policy bool
}

// DeleteTopic deletes a topic with its messages and consumer groups.
func (n *Node) DeleteTopic(ctx context.Context, now time.Time, op *raftpb.DeleteTopic) (DeleteResult, error) {
	return propose[DeleteResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_DeleteTopic{DeleteTopic: op}})
}

// DeleteGroup deletes a consumer group on one topic, or everywhere.
func (n *Node) DeleteGroup(ctx context.Context, now time.Time, op *raftpb.DeleteGroup) (DeleteResult, error) {
	return propose[DeleteResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_DeleteGroup{DeleteGroup: op}})
}

// Ack records acks of a consumer group.
func (n *Node) Ack(ctx context.Context, now time.Time, op *raftpb.Ack) (GroupResult, error) {
	return propose[GroupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Ack{Ack: op}})
}

// RecordFailures records failed deliveries, dead-lettering those marked.
func (n *Node) RecordFailures(ctx context.Context, now time.Time, op *raftpb.RecordFailures) (GroupResult, error) {
	return propose[GroupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_RecordFailures{RecordFailures: op}})
}

// ResetGroup moves a consumer group's position on a topic.
func (n *Node) ResetGroup(ctx context.Context, now time.Time, op *raftpb.ResetGroup) (GroupResult, error) {
	return propose[GroupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_ResetGroup{ResetGroup: op}})
}

// DeadLettersResult is what Redrive moved or PurgeDeadLetters deleted.
type DeadLettersResult struct {
	// Moved are the dead letters a Redrive moved back to their group.
	Moved []*storepb.DeadLetter
	// Purged counts the dead letters a PurgeDeadLetters deleted.
	Purged int
}

// Redrive moves dead letters back to their group with attempts reset.
func (n *Node) Redrive(ctx context.Context, now time.Time, op *raftpb.Redrive) (DeadLettersResult, error) {
	return propose[DeadLettersResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Redrive{Redrive: op}})
}

// PurgeDeadLetters deletes dead letters.
func (n *Node) PurgeDeadLetters(ctx context.Context, now time.Time, op *raftpb.PurgeDeadLetters) (DeadLettersResult, error) {
	return propose[DeadLettersResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_PurgeDeadLetters{PurgeDeadLetters: op}})
}

// CleanupResult counts what retention deleted.
type CleanupResult struct {
	// Messages a Trim dropped from its topic.
	Messages int
	// HalfMessages and DedupKeys a Prune deleted.
	HalfMessages int
	DedupKeys    int
}

// Trim drops a topic's oldest messages.
func (n *Node) Trim(ctx context.Context, now time.Time, op *raftpb.Trim) (CleanupResult, error) {
	return propose[CleanupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Trim{Trim: op}})
}

// Prune deletes old resolved half messages and dedup keys.
func (n *Node) Prune(ctx context.Context, now time.Time, op *raftpb.Prune) (CleanupResult, error) {
	return propose[CleanupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_Prune{Prune: op}})
}

// ProducerGroupResult is a producer group's stored check-back policy after
// an update (zero fields: the broker's defaults).
type ProducerGroupResult struct{ Policy *storepb.ProducerGroup }

// UpdateProducerGroup changes the fields of a producer group's policy that
// op sets.
func (n *Node) UpdateProducerGroup(ctx context.Context, now time.Time, op *raftpb.UpdateProducerGroup) (ProducerGroupResult, error) {
	return propose[ProducerGroupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_UpdateProducerGroup{UpdateProducerGroup: op}})
}

// ConsumerGroupResult is a consumer group's stored delivery policy after an
// update (zero fields: the broker's defaults).
type ConsumerGroupResult struct{ Policy *storepb.ConsumerGroup }

// UpdateConsumerGroup changes the fields of a consumer group's policy that
// op sets.
func (n *Node) UpdateConsumerGroup(ctx context.Context, now time.Time, op *raftpb.UpdateConsumerGroup) (ConsumerGroupResult, error) {
	return propose[ConsumerGroupResult](ctx, n, now, &raftpb.Command{Op: &raftpb.Command_UpdateConsumerGroup{UpdateConsumerGroup: op}})
}

// SetNode records (or, with an empty address, forgets) where a member
// serves the API. It carries no time (0): nothing in it depends on one,
// and the members of a new cluster announce themselves before its leader
// can ask their clocks (broker/clock.go).
func (n *Node) SetNode(ctx context.Context, op *raftpb.SetNode) error {
	_, err := propose[struct{}](ctx, n, time.Unix(0, 0), &raftpb.Command{Op: &raftpb.Command_SetNode{SetNode: op}})
	return err
}

// applied is what the FSM hands back for one entry: the command's result
// (one of the types above) or its refusal.
type applied struct {
	result any
	err    error
}

// propose replicates one command and returns its typed result.
func propose[R any](ctx context.Context, n *Node, now time.Time, cmd *raftpb.Command) (R, error) {
	var zero R
	cmd.Now = now.UnixNano()
	a, err := n.propose(ctx, cmd)
	if err != nil {
		return zero, err
	}
	if a.err != nil {
		return zero, refusal{a.err}
	}
	r, ok := a.result.(R)
	if !ok {
		return zero, fmt.Errorf("raftlog: command applied with a %T result, want %T", a.result, zero)
	}
	return r, nil
}
