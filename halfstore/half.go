package halfstore

import (
	"fmt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// The half message lifecycle, one method per transition:
//
//	PutHalf ──► PENDING ──Resolve(Commit)──► COMMITTED ──► appended to the topic log
//	              │   └────Resolve(Rollback)──► ROLLED_BACK (tombstone)
//	              ├──RecordCheck: a check got no resolution; still PENDING, next check rescheduled
//	              └──Expire: checks used up, or too old──► EXPIRED ──Resolve by an operator──►
//	                 (Expire with rollback, the group's expiry action: ──► ROLLED_BACK)
//
// Each transition checks its preconditions before it writes anything and
// reports whether it changed something: PutHalf's duplicate, Resolve's and
// Expire's changed (RecordCheck always changes the message it accepts). The
// read side is in halfread.go, the check schedule in sched.go.

// PutHalf stores a new PENDING half message. If (producer group,
// transaction ID) already exists it stores nothing and returns the existing
// record with duplicate = true, whatever its state, unless h has another
// topic or body: that is refused with ErrConflict (content.go). The
// caller sets Id,
// Topic, ProducerGroup, TransactionId, CreatedAt and CheckAfter.
func (t *Tx) PutHalf(h *storepb.Half, createTopic bool) (*storepb.Half, bool, error) {
	if h.Id == "" || h.ProducerGroup == "" || h.TransactionId == "" {
		return nil, false, fmt.Errorf("%w: half message needs an ID, a producer group and a transaction ID", ErrInvalid)
	}
	for _, f := range []struct{ kind, v string }{
		{"message ID", h.Id}, {"producer group", h.ProducerGroup}, {"transaction ID", h.TransactionId},
	} {
		if err := checkName(f.kind, f.v); err != nil {
			return nil, false, err
		}
	}
	if len(h.OrderingKey) > maxName {
		return nil, false, fmt.Errorf("%w: ordering key is over %d bytes", ErrInvalid, maxName)
	}
	tk := txKey(h.ProducerGroup, h.TransactionId)
	if id := t.tx.Bucket(bktHalfTx).Get(tk); id != nil {
		existing, err := t.Half(string(id))
		if err != nil {
			return nil, false, err
		}
		if err := sameHalf(existing, h); err != nil {
			return existing, false, err
		}
		return existing, true, nil
	}
	if t.tx.Bucket(bktHalf).Get([]byte(h.Id)) != nil {
		return nil, false, fmt.Errorf("%w: message ID %s already used", ErrInvalid, h.Id)
	}
	if _, err := t.topicFor(h.Topic, createTopic, h.CreatedAt); err != nil {
		return nil, false, err
	}
	h.State = storepb.HalfState_HALF_STATE_PENDING
	h.BodySize = uint32(len(h.Body))
	h.ContentHash = contentHash(h.Body)
	h.NextCheckAt = h.CreatedAt + h.CheckAfter
	if err := t.writeHalf(h, storepb.HalfState_HALF_STATE_UNSPECIFIED); err != nil {
		return nil, false, err
	}
	if err := t.tx.Bucket(bktHalfTx).Put(tk, []byte(h.Id)); err != nil {
		return nil, false, err
	}
	return h, false, t.schedule(h)
}

// writeHalf stores h and moves its state index entry from old to h.State.
func (t *Tx) writeHalf(h *storepb.Half, old storepb.HalfState) error {
	if err := put(t.tx.Bucket(bktHalf), []byte(h.Id), h); err != nil {
		return err
	}
	idx := t.tx.Bucket(bktHalfState)
	if old != storepb.HalfState_HALF_STATE_UNSPECIFIED && old != h.State {
		if err := idx.Delete(stateKey(old, h.Id)); err != nil {
			return err
		}
	}
	return idx.Put(stateKey(h.State, h.Id), present)
}

// Resolution is what Resolve is asked to do.
type Resolution int

// Resolutions.
const (
	Commit Resolution = iota + 1
	Rollback
)

func (r Resolution) target() storepb.HalfState {
	if r == Commit {
		return storepb.HalfState_HALF_STATE_COMMITTED
	}
	return storepb.HalfState_HALF_STATE_ROLLED_BACK
}

func (r Resolution) verb() string {
	if r == Commit {
		return "commit"
	}
	return "roll back"
}

// Resolve commits or rolls back a half message, and reports whether it
// changed it.
//
//   - PENDING: resolved as asked. A commit appends the message to its topic.
//   - Already in the asked state: nothing changes, no error (idempotent),
//     changed = false.
//   - Resolved the other way: ErrConflict naming the state (first
//     resolution wins).
//   - EXPIRED: only SOURCE_OPERATOR may resolve it; others get ErrExpired.
//
// The body is dropped from the half record once resolved: it lives on in the
// topic log (commit) or nowhere (rollback, which leaves a tombstone).
func (t *Tx) Resolve(id string, r Resolution, source storepb.Source, now int64) (h *storepb.Half, changed bool, err error) {
	if r != Commit && r != Rollback {
		return nil, false, fmt.Errorf("%w: resolution must be commit or rollback", ErrInvalid)
	}
	switch source {
	case storepb.Source_SOURCE_PRODUCER, storepb.Source_SOURCE_CHECKBACK, storepb.Source_SOURCE_OPERATOR:
	default:
		return nil, false, fmt.Errorf("%w: a resolution comes from a producer, a check-back or an operator, not %s", ErrInvalid, source)
	}
	if h, err = t.Half(id); err != nil {
		return nil, false, err
	}
	want := r.target()
	switch h.State {
	case want:
		return h, false, nil
	case storepb.HalfState_HALF_STATE_PENDING:
	case storepb.HalfState_HALF_STATE_EXPIRED:
		if source != storepb.Source_SOURCE_OPERATOR {
			return h, false, fmt.Errorf("%w: half message %s is EXPIRED; only an operator can %s it now (brokerctl half commit|rollback)", ErrExpired, id, r.verb())
		}
	default:
		return h, false, fmt.Errorf("%w: half message %s is %s, cannot %s", ErrConflict, id, StateName(h.State), r.verb())
	}
	old := h.State
	if err := t.unschedule(h); err != nil {
		return nil, false, err
	}
	if r == Commit {
		if err := t.commitToTopic(h, now); err != nil {
			return nil, false, err
		}
	}
	h.State = want
	h.ResolvedAt = now
	h.ResolutionSource = source
	if source == storepb.Source_SOURCE_CHECKBACK {
		// The check-back that resolves a message reached its producer:
		// it is an attempt like an unresolving one.
		h.CheckAttempts++
	}
	h.Body = nil
	h.NextCheckAt = 0
	if err := t.writeHalf(h, old); err != nil {
		return nil, false, err
	}
	return h, true, t.markResolved(h)
}

// commitToTopic appends a half message being committed to its topic and
// records its sequence.
func (t *Tx) commitToTopic(h *storepb.Half, now int64) error {
	b, err := t.topicFor(h.Topic, true, now)
	if err != nil {
		return err
	}
	m := &storepb.Message{
		Id:            h.Id,
		Key:           h.Key,
		Properties:    h.Properties,
		Body:          h.Body,
		CommittedAt:   now,
		ProducerGroup: h.ProducerGroup,
		TransactionId: h.TransactionId,
		OrderingKey:   h.OrderingKey,
	}
	if err := appendMessage(b, m); err != nil {
		return err
	}
	h.Sequence = m.Sequence
	return nil
}

// markResolved indexes a half message that reached COMMITTED or
// ROLLED_BACK, so that Prune finds the old ones without a scan.
func (t *Tx) markResolved(h *storepb.Half) error {
	return t.tx.Bucket(bktHalfRes).Put(append(u64(uint64(h.ResolvedAt)), h.Id...), present)
}

// Expire ends a PENDING half message whose checks are used up or that is
// too old: parked as EXPIRED for an operator, or, when rollback is set (the
// group's expiry action), rolled back with source EXPIRY. It reports
// whether it changed the message: expiring an EXPIRED message changes
// nothing (changed = false); a resolved one is left alone and reported with
// ErrConflict.
func (t *Tx) Expire(id string, now int64, rollback bool) (h *storepb.Half, changed bool, err error) {
	if h, err = t.Half(id); err != nil {
		return nil, false, err
	}
	switch h.State {
	case storepb.HalfState_HALF_STATE_EXPIRED:
		return h, false, nil
	case storepb.HalfState_HALF_STATE_PENDING:
	default:
		return h, false, fmt.Errorf("%w: half message %s is %s, cannot expire", ErrConflict, id, StateName(h.State))
	}
	if err := t.unschedule(h); err != nil {
		return nil, false, err
	}
	h.State = storepb.HalfState_HALF_STATE_EXPIRED
	if rollback {
		h.State = storepb.HalfState_HALF_STATE_ROLLED_BACK
		h.Body = nil
	}
	h.ResolvedAt = now
	h.ResolutionSource = storepb.Source_SOURCE_EXPIRY
	h.NextCheckAt = 0
	if err := t.writeHalf(h, storepb.HalfState_HALF_STATE_PENDING); err != nil {
		return nil, false, err
	}
	if rollback {
		return h, true, t.markResolved(h)
	}
	return h, true, nil
}

// RecordCheck records a check-back of a PENDING message that got no
// resolution: when reached (the check got to a producer) it uses one
// attempt; errMsg is kept as the last check error; the next check is due at
// next. A message resolved meanwhile is left alone (ErrConflict).
func (t *Tx) RecordCheck(id string, reached bool, errMsg string, next int64) (*storepb.Half, error) {
	h, err := t.Half(id)
	if err != nil {
		return nil, err
	}
	if h.State != storepb.HalfState_HALF_STATE_PENDING {
		return h, fmt.Errorf("%w: half message %s is %s, no longer checked", ErrConflict, id, StateName(h.State))
	}
	if err := t.unschedule(h); err != nil {
		return nil, err
	}
	if reached {
		h.CheckAttempts++
	}
	h.LastCheckError = errMsg
	h.NextCheckAt = next
	if err := put(t.tx.Bucket(bktHalf), []byte(h.Id), h); err != nil {
		return nil, err
	}
	return h, t.schedule(h)
}
