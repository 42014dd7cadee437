package raftlog

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

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
	// ConsumerGroup is the policy a SetConsumerGroup stored.
	ConsumerGroup *storepb.ConsumerGroup
	// DeadLetters are the dead letters a RecordFailures created, or those a
	// Redrive moved.
	DeadLetters []*storepb.DeadLetter
	// Count is how many dead letters a PurgeDeadLetters deleted, messages a
	// Trim dropped, or half messages plus dedup keys a Prune deleted.
	Count int
	// Err is a refusal of the command by the state machine (a precondition
	// such as first resolution wins). It is deterministic: every node refuses
	// the same command the same way.
	Err error
}

// EventKind says what an Event reports.
type EventKind int

// Event kinds.
const (
	// EventAppended: Topic got new committed messages (the zero value).
	EventAppended EventKind = iota
	// EventTrimmed: Topic's oldest messages were dropped by retention.
	EventTrimmed
	// EventGroupReset: Group's position on Topic was reset.
	EventGroupReset
	// EventRedriven: dead letters of Group on Topic were redriven.
	EventRedriven
	// EventPurged: dead letters of Group on Topic were purged.
	EventPurged
	// EventGroupConfig: Group's delivery policy changed (Topic is empty).
	EventGroupConfig
	// EventResolved: Half left PENDING or EXPIRED (committed, rolled back
	// or expired, by whichever source); Group is its producer group. One
	// event per message; a resolution that repeats an earlier one reports
	// nothing.
	EventResolved
)

// Event tells the node's owner what a batch changed, so that it can wake
// whoever waits for it (consumer dispatchers wait for new messages, and
// reload their state after a reset, redrive, purge, trim or new policy),
// and count what happened to half messages. A batch reports each event
// once.
type Event struct {
	Kind  EventKind
	Topic string
	Group string
	// Half is the half message as an EventResolved left it (without its
	// body once resolved). It must not be changed.
	Half *storepb.Half
}

// Hooks hear of the node's storage work, for metrics: the broker turns them
// into Prometheus histograms, so that raftlog needs no metrics library.
// Nil fields are skipped. They run on Raft's goroutines and must not block.
// Their durations come from the local clock, which never reaches the state.
type Hooks struct {
	// Applied: the FSM applied entries (those that changed the store) in
	// one bbolt transaction that took d, its fsync included.
	Applied func(entries int, d time.Duration)
	// LogStored: the Raft log store wrote entries, with one fsync, in d.
	LogStored func(entries int, d time.Duration)
	// SnapshotPersisted: a snapshot of the store was written out in d.
	SnapshotPersisted func(d time.Duration)
}

// fsm applies committed log entries to the store. Each batch of entries is
// one bbolt transaction that also records the last applied index, so a
// restart skips what the store already has instead of applying it twice.
type fsm struct {
	store   *halfstore.Store
	logger  *slog.Logger
	onApply func([]Event)
	hooks   Hooks

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
	seen := map[Event]bool{}
	var applied uint64
	start := time.Now()
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
			if ev, ok := eventOf(cmd, r); ok && !seen[ev] {
				seen[ev] = true
				events = append(events, ev)
			}
			if h := resolvedHalf(cmd, r); h != nil {
				events = append(events, Event{Kind: EventResolved, Topic: h.Topic, Group: h.ProducerGroup, Half: h})
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
		if f.hooks.Applied != nil {
			f.hooks.Applied(int(applied), time.Since(start))
		}
	}
	if len(events) > 0 && f.onApply != nil {
		f.onApply(events)
	}
	return results
}

// eventOf is the event a command's result is worth, if it changed
// something a dispatcher must know of.
func eventOf(cmd *raftpb.Command, r *Result) (Event, bool) {
	if r.Err != nil || r.Duplicate {
		return Event{}, false
	}
	switch op := cmd.Op.(type) {
	case *raftpb.Command_Send:
		return Event{Kind: EventAppended, Topic: op.Send.Topic}, true
	case *raftpb.Command_Resolve:
		if r.Half != nil && r.Half.State == storepb.HalfState_HALF_STATE_COMMITTED {
			return Event{Kind: EventAppended, Topic: r.Half.Topic}, true
		}
	case *raftpb.Command_Trim:
		return Event{Kind: EventTrimmed, Topic: op.Trim.Topic}, r.Count > 0
	case *raftpb.Command_ResetGroup:
		return Event{Kind: EventGroupReset, Topic: op.ResetGroup.Topic, Group: op.ResetGroup.Group}, true
	case *raftpb.Command_Redrive:
		return Event{Kind: EventRedriven, Topic: op.Redrive.Topic, Group: op.Redrive.Group}, len(r.DeadLetters) > 0
	case *raftpb.Command_PurgeDeadLetters:
		p := op.PurgeDeadLetters
		return Event{Kind: EventPurged, Topic: p.Topic, Group: p.Group}, r.Count > 0
	case *raftpb.Command_SetConsumerGroup:
		return Event{Kind: EventGroupConfig, Group: op.SetConsumerGroup.Name}, true
	}
	return Event{}, false
}

// resolvedHalf is the half message a command took out of PENDING or
// EXPIRED, if it did.
func resolvedHalf(cmd *raftpb.Command, r *Result) *storepb.Half {
	if r.Err != nil || r.Duplicate || r.Half == nil {
		return nil
	}
	switch cmd.Op.(type) {
	case *raftpb.Command_Resolve, *raftpb.Command_Expire:
		return r.Half
	}
	return nil
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
			Id:          s.MessageId,
			Key:         s.Key,
			Properties:  s.Properties,
			Body:        s.Body,
			OrderingKey: s.OrderingKey,
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
			OrderingKey:   s.OrderingKey,
		}, s.CreateTopic)
	case *raftpb.Command_Resolve:
		r.Half, r.Duplicate, err = resolve(tx, op.Resolve, now)
	case *raftpb.Command_CreateGroup:
		g := op.CreateGroup
		r.Group, r.Created, err = tx.CreateGroup(g.Topic, g.Group, groupStart(g.Start, g.StartTime), now)
	case *raftpb.Command_Ack:
		a := op.Ack
		r.Group, err = tx.Ack(a.Topic, a.Group, a.Sequences, a.Redriven)
	case *raftpb.Command_RecordFailures:
		rf := op.RecordFailures
		fs := make([]halfstore.Failure, len(rf.Failures))
		for i, f := range rf.Failures {
			fs[i] = halfstore.Failure{
				Seq:      f.Sequence,
				Redriven: f.Redriven,
				Attempts: f.Attempts,
				RetryAt:  f.RetryAt,
				Error:    f.Error,
				Dead:     f.Dead,
			}
		}
		r.Group, r.DeadLetters, err = tx.RecordFailures(rf.Topic, rf.Group, fs, now)
	case *raftpb.Command_SetConsumerGroup:
		g := op.SetConsumerGroup
		r.ConsumerGroup = &storepb.ConsumerGroup{
			Name:              g.Name,
			MaxDeliveries:     g.MaxDeliveries,
			AckDeadline:       g.AckDeadline,
			RedeliveryBackoff: g.RedeliveryBackoff,
			OrderedPoison:     g.OrderedPoison,
		}
		err = tx.PutConsumerGroup(r.ConsumerGroup)
	case *raftpb.Command_ResetGroup:
		g := op.ResetGroup
		r.Group, err = tx.ResetGroup(g.Topic, g.Group, groupStart(g.To, g.Time))
	case *raftpb.Command_Redrive:
		d := op.Redrive
		r.DeadLetters, err = tx.Redrive(d.Topic, d.Group, d.Sequences, d.All, int(d.Limit))
	case *raftpb.Command_PurgeDeadLetters:
		p := op.PurgeDeadLetters
		r.Count, err = tx.PurgeDeadLetters(p.Topic, p.Group, p.Sequences, p.All, int(p.Limit))
	case *raftpb.Command_Trim:
		tr := op.Trim
		r.Count, err = tx.Trim(tr.Topic, tr.Through, int(tr.Limit))
	case *raftpb.Command_Prune:
		p := op.Prune
		var halves, dedups int
		halves, dedups, err = tx.Prune(p.ResolvedBefore, p.DedupBefore, int(p.Limit))
		r.Count = halves + dedups
	case *raftpb.Command_RecordCheck:
		c := op.RecordCheck
		r.Half, err = tx.RecordCheck(c.MessageId, c.Reached, c.Error, c.NextCheckAt)
	case *raftpb.Command_Expire:
		var changed bool
		r.Half, changed, err = tx.Expire(op.Expire.MessageId, now, op.Expire.Rollback)
		r.Duplicate = !changed
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

// groupStart turns a command's start position into the store's. An
// unspecified position is the earliest, as it always was; a timestamp of 0
// is before every message, so the earliest too.
func groupStart(p raftpb.StartPosition, at int64) halfstore.GroupStart {
	switch p {
	case raftpb.StartPosition_START_POSITION_LATEST:
		return halfstore.GroupStart{Latest: true}
	case raftpb.StartPosition_START_POSITION_TIMESTAMP:
		return halfstore.GroupStart{Time: at}
	}
	return halfstore.GroupStart{}
}

// resolve reports as a duplicate a resolution that changes nothing (the
// message already was in the asked state).
func resolve(tx *halfstore.Tx, op *raftpb.Resolve, now int64) (*storepb.Half, bool, error) {
	id := op.MessageId
	if id == "" {
		var err error
		if id, err = tx.HalfIDByTx(op.ProducerGroup, op.TransactionId); err != nil {
			return nil, false, err
		}
	}
	var res halfstore.Resolution
	switch op.Resolution {
	case raftpb.Resolution_RESOLUTION_COMMIT:
		res = halfstore.Commit
	case raftpb.Resolution_RESOLUTION_ROLLBACK:
		res = halfstore.Rollback
	}
	h, changed, err := tx.Resolve(id, res, storepb.Source(op.Source), now)
	return h, !changed, err
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
	return &fsmSnapshot{sn: sn, persisted: f.hooks.SnapshotPersisted}, nil
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
	sn        *halfstore.Snapshot
	persisted func(time.Duration)
}

func (s *fsmSnapshot) Persist(sink raft.SnapshotSink) error {
	start := time.Now()
	if _, err := s.sn.WriteTo(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("raftlog: persist snapshot: %w", err)
	}
	if err := sink.Close(); err != nil {
		return err
	}
	if s.persisted != nil {
		s.persisted(time.Since(start))
	}
	return nil
}

func (s *fsmSnapshot) Release() { s.sn.Release() }
