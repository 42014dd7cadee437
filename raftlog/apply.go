package raftlog

import (
	"errors"
	"fmt"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// applier applies the commands of one batch inside the batch's store
// transaction, one method per command (named as in commands.go), and
// collects the events the batch is worth. Each method returns the
// command's result, or an error: a refusal (isRefusal) that changed
// nothing, or a storage failure that stops the node.
type applier struct {
	tx  *halfstore.Tx
	now int64
	// latest is the latest time stamped into a command of the batch.
	latest int64

	events []Event
	seen   map[Event]bool
}

func newApplier(tx *halfstore.Tx) *applier {
	return &applier{tx: tx, seen: map[Event]bool{}}
}

// emit reports an event once per batch; every resolution is its own.
func (a *applier) emit(ev Event) {
	if ev.Kind != EventResolved {
		if a.seen[ev] {
			return
		}
		a.seen[ev] = true
	}
	a.events = append(a.events, ev)
}

func (a *applier) apply(cmd *raftpb.Command) (any, error) {
	a.now = cmd.Now
	a.latest = max(a.latest, cmd.Now)
	switch op := cmd.Op.(type) {
	case *raftpb.Command_CreateTopic:
		return a.createTopic(op.CreateTopic)
	case *raftpb.Command_Send:
		return a.send(op.Send)
	case *raftpb.Command_SendHalf:
		return a.sendHalf(op.SendHalf)
	case *raftpb.Command_Resolve:
		return a.resolve(op.Resolve)
	case *raftpb.Command_RecordCheck:
		return a.recordCheck(op.RecordCheck)
	case *raftpb.Command_Expire:
		return a.expire(op.Expire)
	case *raftpb.Command_CreateGroup:
		return a.createGroup(op.CreateGroup)
	case *raftpb.Command_Ack:
		return a.ack(op.Ack)
	case *raftpb.Command_RecordFailures:
		return a.recordFailures(op.RecordFailures)
	case *raftpb.Command_ResetGroup:
		return a.resetGroup(op.ResetGroup)
	case *raftpb.Command_Redrive:
		return a.redrive(op.Redrive)
	case *raftpb.Command_PurgeDeadLetters:
		return a.purgeDeadLetters(op.PurgeDeadLetters)
	case *raftpb.Command_Trim:
		return a.trim(op.Trim)
	case *raftpb.Command_Prune:
		return a.prune(op.Prune)
	case *raftpb.Command_UpdateProducerGroup:
		return a.updateProducerGroup(op.UpdateProducerGroup)
	case *raftpb.Command_UpdateConsumerGroup:
		return a.updateConsumerGroup(op.UpdateConsumerGroup)
	case *raftpb.Command_SetProducerGroup:
		return a.setProducerGroup(op.SetProducerGroup)
	case *raftpb.Command_SetConsumerGroup:
		return a.setConsumerGroup(op.SetConsumerGroup)
	case *raftpb.Command_SetNode:
		return struct{}{}, a.tx.SetNode(op.SetNode.Id, op.SetNode.GrpcAddress, op.SetNode.RocketmqAddress)
	case *raftpb.Command_DeleteTopic:
		return a.deleteTopic(op.DeleteTopic)
	case *raftpb.Command_DeleteGroup:
		return a.deleteGroup(op.DeleteGroup)
	case *raftpb.Command_Batch:
		return a.batch(op.Batch)
	}
	return nil, ErrUnknownCommand
}

// isRefusal tells a refused command (deterministic, reported to the
// proposer) from a failing store.
func isRefusal(err error) bool {
	for _, s := range []error{halfstore.ErrNotFound, halfstore.ErrConflict, halfstore.ErrExpired, halfstore.ErrInvalid, ErrUnknownCommand} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// batch applies merged proposals in order, each with its own time and its
// own result or refusal. A storage failure of any stops the node.
func (a *applier) batch(op *raftpb.Batch) ([]applied, error) {
	out := make([]applied, len(op.Commands))
	for i, c := range op.Commands {
		if _, nested := c.Op.(*raftpb.Command_Batch); nested {
			out[i] = applied{err: fmt.Errorf("%w: a batch inside a batch", ErrUnknownCommand)}
			continue
		}
		res, err := a.apply(c)
		if err != nil && !isRefusal(err) {
			return nil, fmt.Errorf("command %d of the batch (%s): %w", i, describe(c), err)
		}
		out[i] = applied{result: res, err: err}
	}
	return out, nil
}

func (a *applier) createTopic(op *raftpb.CreateTopic) (TopicResult, error) {
	tp, created, err := a.tx.CreateTopic(op.Name, a.now)
	return TopicResult{Topic: tp, Created: created}, err
}

func (a *applier) send(op *raftpb.Send) (SendResult, error) {
	m, dup, err := a.tx.Send(op.Topic, &storepb.Message{
		Id:          op.MessageId,
		Key:         op.Key,
		Properties:  op.Properties,
		Body:        op.Body,
		OrderingKey: op.OrderingKey,
	}, op.CreateTopic, op.DedupWindow, a.now)
	if err != nil {
		return SendResult{}, err
	}
	if !dup {
		a.emit(Event{Kind: EventAppended, Topic: op.Topic})
	}
	return SendResult{MessageID: m.Id, Sequence: m.Sequence, Duplicate: dup}, nil
}

func (a *applier) sendHalf(op *raftpb.SendHalf) (HalfResult, error) {
	h, dup, err := a.tx.PutHalf(&storepb.Half{
		Id:            op.MessageId,
		Topic:         op.Topic,
		ProducerGroup: op.ProducerGroup,
		TransactionId: op.TransactionId,
		Key:           op.Key,
		Properties:    op.Properties,
		Body:          op.Body,
		CreatedAt:     a.now,
		CheckAfter:    op.CheckAfter,
		OrderingKey:   op.OrderingKey,
	}, op.CreateTopic)
	return HalfResult{Half: h, Changed: !dup}, err
}

// resolved reports a half message that left PENDING or EXPIRED, and wakes
// its topic's dispatchers when it was committed.
func (a *applier) resolved(h *storepb.Half) {
	if h.State == storepb.HalfState_HALF_STATE_COMMITTED {
		a.emit(Event{Kind: EventAppended, Topic: h.Topic})
	}
	a.emit(Event{Kind: EventResolved, Topic: h.Topic, Group: h.ProducerGroup, Half: h})
}

func (a *applier) resolve(op *raftpb.Resolve) (HalfResult, error) {
	id := op.MessageId
	if id == "" {
		var err error
		if id, err = a.tx.HalfIDByTx(op.ProducerGroup, op.TransactionId); err != nil {
			return HalfResult{}, err
		}
	}
	var res halfstore.Resolution
	switch op.Resolution {
	case raftpb.Resolution_RESOLUTION_COMMIT:
		res = halfstore.Commit
	case raftpb.Resolution_RESOLUTION_ROLLBACK:
		res = halfstore.Rollback
	}
	h, changed, err := a.tx.Resolve(id, res, op.Source, a.now)
	if err != nil {
		return HalfResult{Half: h}, err
	}
	if changed {
		a.resolved(h)
	}
	return HalfResult{Half: h, Changed: changed}, nil
}

func (a *applier) recordCheck(op *raftpb.RecordCheck) (HalfResult, error) {
	h, err := a.tx.RecordCheck(op.MessageId, op.Reached, op.Error, op.NextCheckAt)
	return HalfResult{Half: h, Changed: err == nil}, err
}

func (a *applier) expire(op *raftpb.Expire) (HalfResult, error) {
	h, changed, err := a.tx.Expire(op.MessageId, a.now, op.Rollback)
	if err != nil {
		return HalfResult{Half: h}, err
	}
	if changed {
		a.resolved(h)
	}
	return HalfResult{Half: h, Changed: changed}, nil
}

// GroupStart is the store's form of a command's start position. An
// unspecified position is the earliest, as it always was; a timestamp of 0
// is before every message, so the earliest too.
func GroupStart(p raftpb.StartPosition, at int64) halfstore.GroupStart {
	switch p {
	case raftpb.StartPosition_START_POSITION_LATEST:
		return halfstore.GroupStart{Latest: true}
	case raftpb.StartPosition_START_POSITION_TIMESTAMP:
		return halfstore.GroupStart{Time: at}
	}
	return halfstore.GroupStart{}
}

func (a *applier) createGroup(op *raftpb.CreateGroup) (GroupResult, error) {
	g, created, err := a.tx.CreateGroup(op.Topic, op.Group, GroupStart(op.Start, op.StartTime), a.now, op.AutoCreated)
	return GroupResult{Group: g, Created: created}, err
}

// deleteTopic deletes a topic as it is when the command applies: what was
// committed to it before goes with it; what comes after finds no topic (or
// creates a new one, with auto-create-topics). Pending or expired half
// messages of the topic refuse it.
func (a *applier) deleteTopic(op *raftpb.DeleteTopic) (DeleteResult, error) {
	tp, groups, err := a.tx.DeleteTopic(op.Name)
	if err != nil {
		return DeleteResult{}, err
	}
	a.emit(Event{Kind: EventDeleted, Topic: op.Name})
	return DeleteResult{Topic: tp, Groups: groups}, nil
}

func (a *applier) deleteGroup(op *raftpb.DeleteGroup) (DeleteResult, error) {
	groups, policy, err := a.tx.DeleteGroup(op.Group, op.Topic)
	if err != nil {
		return DeleteResult{}, err
	}
	for _, g := range groups {
		a.emit(Event{Kind: EventDeleted, Topic: g.Group.Topic, Group: op.Group})
	}
	return DeleteResult{Groups: groups, Policy: policy}, nil
}

func (a *applier) ack(op *raftpb.Ack) (GroupResult, error) {
	g, err := a.tx.Ack(op.Topic, op.Group, op.Sequences, op.Redriven)
	return GroupResult{Group: g}, err
}

func (a *applier) recordFailures(op *raftpb.RecordFailures) (GroupResult, error) {
	fs := make([]halfstore.Failure, len(op.Failures))
	for i, f := range op.Failures {
		fs[i] = halfstore.Failure{
			Seq:      f.Sequence,
			Redriven: f.Redriven,
			Attempts: f.Attempts,
			RetryAt:  f.RetryAt,
			Error:    f.Error,
			Dead:     f.Dead,
		}
	}
	g, dead, err := a.tx.RecordFailures(op.Topic, op.Group, fs, a.now)
	return GroupResult{Group: g, DeadLetters: dead}, err
}

func (a *applier) resetGroup(op *raftpb.ResetGroup) (GroupResult, error) {
	g, err := a.tx.ResetGroup(op.Topic, op.Group, GroupStart(op.To, op.Time))
	if err == nil {
		a.emit(Event{Kind: EventGroupReset, Topic: op.Topic, Group: op.Group})
	}
	return GroupResult{Group: g}, err
}

func (a *applier) redrive(op *raftpb.Redrive) (DeadLettersResult, error) {
	moved, err := a.tx.Redrive(op.Topic, op.Group, op.Sequences, op.All, int(op.Limit))
	if err == nil && len(moved) > 0 {
		a.emit(Event{Kind: EventRedriven, Topic: op.Topic, Group: op.Group})
	}
	return DeadLettersResult{Moved: moved}, err
}

func (a *applier) purgeDeadLetters(op *raftpb.PurgeDeadLetters) (DeadLettersResult, error) {
	n, err := a.tx.PurgeDeadLetters(op.Topic, op.Group, op.Sequences, op.All, int(op.Limit))
	if err == nil && n > 0 {
		a.emit(Event{Kind: EventPurged, Topic: op.Topic, Group: op.Group})
	}
	return DeadLettersResult{Purged: n}, err
}

func (a *applier) trim(op *raftpb.Trim) (CleanupResult, error) {
	n, err := a.tx.Trim(op.Topic, op.Through, int(op.Limit))
	if err == nil && n > 0 {
		a.emit(Event{Kind: EventTrimmed, Topic: op.Topic})
	}
	return CleanupResult{Messages: n}, err
}

func (a *applier) prune(op *raftpb.Prune) (CleanupResult, error) {
	halves, dedups, err := a.tx.Prune(op.ResolvedBefore, op.DedupBefore, int(op.Limit))
	return CleanupResult{HalfMessages: halves, DedupKeys: dedups}, err
}

// updateProducerGroup merges the fields op sets into the stored policy.
func (a *applier) updateProducerGroup(op *raftpb.UpdateProducerGroup) (ProducerGroupResult, error) {
	pg, err := a.tx.ProducerGroup(op.Name)
	if err != nil {
		return ProducerGroupResult{}, err
	}
	if op.MaxChecks != nil {
		pg.MaxChecks = *op.MaxChecks
	}
	if op.CheckBackoff != nil {
		pg.CheckBackoff = *op.CheckBackoff
	}
	if op.MaxCheckBackoff != nil {
		pg.MaxCheckBackoff = *op.MaxCheckBackoff
	}
	if op.MaxHalfAge != nil {
		pg.MaxHalfAge = *op.MaxHalfAge
	}
	if op.ExpiryAction != nil {
		pg.ExpiryAction = *op.ExpiryAction
	}
	if op.CallbackUrl != nil {
		pg.CallbackUrl = *op.CallbackUrl
	}
	return ProducerGroupResult{Policy: pg}, a.tx.PutProducerGroup(pg)
}

// updateConsumerGroup merges the fields op sets into the stored policy.
func (a *applier) updateConsumerGroup(op *raftpb.UpdateConsumerGroup) (ConsumerGroupResult, error) {
	cg, err := a.tx.ConsumerGroup(op.Name)
	if err != nil {
		return ConsumerGroupResult{}, err
	}
	if op.MaxDeliveries != nil {
		cg.MaxDeliveries = *op.MaxDeliveries
	}
	if op.AckDeadline != nil {
		cg.AckDeadline = *op.AckDeadline
	}
	if op.RedeliveryBackoff != nil {
		cg.RedeliveryBackoff = op.RedeliveryBackoff.Steps
	}
	if op.OrderedPoison != nil {
		cg.OrderedPoison = *op.OrderedPoison
	}
	if err := a.tx.PutConsumerGroup(cg); err != nil {
		return ConsumerGroupResult{}, err
	}
	a.emit(Event{Kind: EventGroupConfig, Group: op.Name})
	return ConsumerGroupResult{Policy: cg}, nil
}

// setProducerGroup applies a whole policy as written by an earlier version.
func (a *applier) setProducerGroup(op *raftpb.SetProducerGroup) (ProducerGroupResult, error) {
	pg := &storepb.ProducerGroup{
		Name:            op.Name,
		MaxChecks:       op.MaxChecks,
		CheckBackoff:    op.CheckBackoff,
		MaxCheckBackoff: op.MaxCheckBackoff,
		MaxHalfAge:      op.MaxHalfAge,
		ExpiryAction:    op.ExpiryAction,
		CallbackUrl:     op.CallbackUrl,
	}
	return ProducerGroupResult{Policy: pg}, a.tx.PutProducerGroup(pg)
}

// setConsumerGroup applies a whole policy as written by an earlier version.
func (a *applier) setConsumerGroup(op *raftpb.SetConsumerGroup) (ConsumerGroupResult, error) {
	cg := &storepb.ConsumerGroup{
		Name:              op.Name,
		MaxDeliveries:     op.MaxDeliveries,
		AckDeadline:       op.AckDeadline,
		RedeliveryBackoff: op.RedeliveryBackoff,
		OrderedPoison:     op.OrderedPoison,
	}
	if err := a.tx.PutConsumerGroup(cg); err != nil {
		return ConsumerGroupResult{}, err
	}
	a.emit(Event{Kind: EventGroupConfig, Group: op.Name})
	return ConsumerGroupResult{Policy: cg}, nil
}

// describe names a command for errors.
func describe(cmd *raftpb.Command) string {
	if cmd.Op == nil {
		return "empty command"
	}
	return fmt.Sprintf("%T", cmd.Op)
}
