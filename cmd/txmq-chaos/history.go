package main

import (
	"bufio"
	"encoding/json"
	"os"
	"slices"
	"sync"
	"time"
)

// Kinds of events in a history.
const (
	evTx      = "tx"      // a transaction: SendHalf, the local transaction, Commit or Rollback (or none)
	evSend    = "send"    // a plain Send with a key
	evDeliver = "deliver" // a delivery to a consumer group, from the handler's start to its end
	evFault   = "fault"   // a nemesis started a fault
	evHeal    = "heal"    // a nemesis lifted its fault
	evCheck   = "check"   // the producers' checker answered a check-back (commit or rollback)
)

// Outcomes of a transaction, as the local database (the truth) has it.
const (
	txCommit        = "commit"         // committed locally, Commit sent
	txRollback      = "rollback"       // failed locally, Rollback sent
	txCrashCommit   = "crash-commit"   // committed locally, then "crashed": check-back must commit
	txCrashRollback = "crash-rollback" // failed locally, then "crashed": check-back must roll back
	txAborted       = "aborted"        // SendHalf failed: the local transaction never ran
)

// committedInTruth reports whether the local database committed the
// transaction, so that its message must reach every group.
func committedInTruth(outcome string) bool {
	return outcome == txCommit || outcome == txCrashCommit
}

// Event is one operation of the history.
type Event struct {
	T   time.Time `json:"t"`
	End time.Time `json:"end,omitzero"`
	// Mid: for a transaction, when SendHalf returned (and Commit or
	// Rollback was called).
	Mid  time.Time `json:"mid,omitzero"`
	Kind string    `json:"kind"`

	TxID    string `json:"tx,omitempty"`
	Key     string `json:"key,omitempty"` // a Send's dedup key
	MsgID   string `json:"msg,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	// OK: a Send or a transaction's last call (Commit, Rollback) succeeded;
	// for a delivery, the handler acked it.
	OK  bool   `json:"ok,omitempty"`
	Err string `json:"err,omitempty"`

	Group       string `json:"group,omitempty"`
	Seq         uint64 `json:"seq,omitempty"`
	OrderingKey string `json:"okey,omitempty"`
	Attempt     uint32 `json:"attempt,omitempty"`

	Fault   string `json:"fault,omitempty"`   // fault and heal: what, on whom
	Nemesis string `json:"nemesis,omitempty"` // fault: the nemesis and its variant
}

// History records events from many goroutines.
type History struct {
	mu     sync.Mutex
	events []Event
}

// Add records e, stamped now unless it has a time.
func (h *History) Add(e Event) {
	if e.T.IsZero() {
		e.T = time.Now()
	}
	h.mu.Lock()
	h.events = append(h.events, e)
	h.mu.Unlock()
}

// Events are the events so far, by time.
func (h *History) Events() []Event {
	h.mu.Lock()
	out := slices.Clone(h.events)
	h.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Event) int { return a.T.Compare(b.T) })
	return out
}

// WriteFile writes the events as JSON lines.
func (h *History) WriteFile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, e := range h.Events() {
		if err := enc.Encode(e); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
