package raftlog

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Result is what applying one command produced. The leader hands it back to
// the proposer; followers drop it.
type Result struct {
	MessageID string
	Sequence  uint64
	Duplicate bool
	Created   bool
	Half      *storepb.Half
	Topic     *storepb.Topic
	Group     *storepb.Group
	// ProducerGroup is the policy a SetProducerGroup stored.
	ProducerGroup *storepb.ProducerGroup
	// Err is a refusal of the command by the state machine (a precondition
	// such as first resolution wins). It is deterministic: every node refuses
	// the same command the same way.
	Err error
}

// Event tells the node's owner what a batch changed, so that it can wake
// whoever waits for it (consumer dispatchers wait for new messages).
type Event struct {
	// Topic got at least one new committed message.
	Topic string
}

// fsm applies committed log entries to the store. Each batch of entries is
// one bbolt transaction that also records the last applied index, so a
// restart skips what the store already has instead of applying it twice.
type fsm struct {
	store   *halfstore.Store
	logger  *slog.Logger
	onApply func([]Event)

	// applied counts the entries that changed the store since start, and
	// batches the bbolt transactions that carried them: how well group
	// commit shares fsyncs, and proof that a restart re-applies nothing.
	applied atomic.Uint64
	batches atomic.Uint64
}

var _ raft.BatchingFSM = (*fsm)(nil)

// Apply implements raft.FSM for the rare single-entry path.
func (f *fsm) Apply(l *raft.Log) interface{} {
	return f.ApplyBatch([]*raft.Log{l})[0]
}

// ApplyBatch applies a batch of committed entries in one transaction.
func (f *fsm) ApplyBatch(logs []*raft.Log) []interface{} {
	results := make([]interface{}, len(logs))
	var events []Event
	seen := map[string]bool{}
	var applied uint64
	err := f.store.Update(func(tx *halfstore.Tx) error {
		last := tx.AppliedIndex()
		for i, l := range logs {
			if l.Index <= last {
				// Already in the store: replay after a restart.
				continue
			}
			last = l.Index
			if l.Type != raft.LogCommand {
				continue
			}
			cmd := &raftpb.Command{}
			if err := proto.Unmarshal(l.Data, cmd); err != nil {
				results[i] = &Result{Err: fmt.Errorf("raftlog: undecodable command at index %d: %w", l.Index, err)}
				continue
			}
			r, err := applyCommand(tx, cmd)
			if err != nil {
				return fmt.Errorf("index %d: %w", l.Index, err)
			}
			results[i] = r
			applied++
			if t := appendedTopic(cmd, r); t != "" && !seen[t] {
				seen[t] = true
				events = append(events, Event{Topic: t})
			}
		}
		if last == tx.AppliedIndex() {
			return nil
		}
		return tx.SetAppliedIndex(last)
	})
	if err != nil {
		// The log is the truth and every node must apply it identically; a
		// store that cannot take a write cannot go on.
		f.logger.Error("cannot apply committed entries", "err", err)
		panic(fmt.Sprintf("raftlog: apply: %v", err))
	}
	f.applied.Add(applied)
	if applied > 0 {
		f.batches.Add(1)
	}
	if len(events) > 0 && f.onApply != nil {
		f.onApply(events)
	}
	return results
}

// appendedTopic names the topic a command appended to, if any.
func appendedTopic(cmd *raftpb.Command, r *Result) string {
	if r.Err != nil || r.Duplicate {
		return ""
	}
	switch op := cmd.Op.(type) {
	case *raftpb.Command_Send:
		return op.Send.Topic
	case *raftpb.Command_Resolve:
		if r.Half != nil && r.Half.State == storepb.HalfState_HALF_STATE_COMMITTED {
			return r.Half.Topic
		}
	}
	return ""
}

// applyCommand runs one command. Refusals go into Result.Err; the returned
// error is a storage failure that must stop the node.
func applyCommand(tx *halfstore.Tx, cmd *raftpb.Command) (*Result, error) {
	now := cmd.Now
	r := &Result{}
	var err error
	switch op := cmd.Op.(type) {
	case *raftpb.Command_CreateTopic:
		r.Topic, r.Created, err = tx.CreateTopic(op.CreateTopic.Name, now)
	case *raftpb.Command_Send:
		s := op.Send
		var m *storepb.Message
		m, r.Duplicate, err = tx.Send(s.Topic, &storepb.Message{
			Id:         s.MessageId,
			Key:        s.Key,
			Properties: s.Properties,
			Body:       s.Body,
		}, s.CreateTopic, s.DedupWindow, now)
		if m != nil {
			r.MessageID, r.Sequence = m.Id, m.Sequence
		}
	case *raftpb.Command_SendHalf:
		s := op.SendHalf
		r.Half, r.Duplicate, err = tx.PutHalf(&storepb.Half{
			Id:            s.MessageId,
			Topic:         s.Topic,
			ProducerGroup: s.ProducerGroup,
			TransactionId: s.TransactionId,
			Key:           s.Key,
			Properties:    s.Properties,
			Body:          s.Body,
			CreatedAt:     now,
			CheckAfter:    s.CheckAfter,
		}, s.CreateTopic)
	case *raftpb.Command_Resolve:
		r.Half, err = resolve(tx, op.Resolve, now)
	case *raftpb.Command_CreateGroup:
		g := op.CreateGroup
		r.Group, r.Created, err = tx.CreateGroup(g.Topic, g.Group, g.Start == raftpb.StartPosition_START_POSITION_LATEST, now)
	case *raftpb.Command_Ack:
		a := op.Ack
		r.Group, err = tx.Ack(a.Topic, a.Group, a.Sequences)
	case *raftpb.Command_RecordCheck:
		c := op.RecordCheck
		r.Half, err = tx.RecordCheck(c.MessageId, c.Reached, c.Error, c.NextCheckAt)
	case *raftpb.Command_Expire:
		r.Half, err = tx.Expire(op.Expire.MessageId, now, op.Expire.Rollback)
	case *raftpb.Command_SetProducerGroup:
		g := op.SetProducerGroup
		r.ProducerGroup = &storepb.ProducerGroup{
			Name:            g.Name,
			MaxChecks:       g.MaxChecks,
			CheckBackoff:    g.CheckBackoff,
			MaxCheckBackoff: g.MaxCheckBackoff,
			MaxHalfAge:      g.MaxHalfAge,
			ExpiryAction:    storepb.ExpiryAction(g.ExpiryAction),
			CallbackUrl:     g.CallbackUrl,
		}
		err = tx.PutProducerGroup(r.ProducerGroup)
	case *raftpb.Command_SetNode:
		err = tx.SetNode(op.SetNode.Id, op.SetNode.GrpcAddress)
	default:
		err = fmt.Errorf("%w: unknown command", halfstore.ErrInvalid)
	}
	if r.Half != nil {
		r.MessageID, r.Sequence = r.Half.Id, r.Half.Sequence
	}
	if err != nil {
		if isRefusal(err) {
			r.Err = err
			return r, nil
		}
		return nil, err
	}
	return r, nil
}

func resolve(tx *halfstore.Tx, op *raftpb.Resolve, now int64) (*storepb.Half, error) {
	id := op.MessageId
	if id == "" {
		var err error
		if id, err = tx.HalfIDByTx(op.ProducerGroup, op.TransactionId); err != nil {
			return nil, err
		}
	}
	var res halfstore.Resolution
	switch op.Resolution {
	case raftpb.Resolution_RESOLUTION_COMMIT:
		res = halfstore.Commit
	case raftpb.Resolution_RESOLUTION_ROLLBACK:
		res = halfstore.Rollback
	}
	return tx.Resolve(id, res, storepb.Source(op.Source), now)
}

// isRefusal tells a refused command (deterministic, reported to the caller)
// from a failing store.
func isRefusal(err error) bool {
	for _, s := range []error{halfstore.ErrNotFound, halfstore.ErrConflict, halfstore.ErrExpired, halfstore.ErrInvalid} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// Snapshot captures the store in a read transaction; Persist streams it out
// while the FSM goes on applying.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	sn, err := f.store.Snapshot()
	if err != nil {
		return nil, err
	}
	return &fsmSnapshot{sn: sn}, nil
}

// Restore replaces the store with a snapshot's.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	if err := f.store.Restore(rc); err != nil {
		return err
	}
	idx, err := f.store.AppliedIndex()
	if err != nil {
		return err
	}
	f.logger.Info("store restored from snapshot", "applied_index", idx)
	return nil
}

type fsmSnapshot struct {
	sn *halfstore.Snapshot
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.sn.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftlog: persist snapshot: %w", err)
	}
	return sink.Close()
}

func (s *fsmSnapshot) Release() { s.sn.Release() }
