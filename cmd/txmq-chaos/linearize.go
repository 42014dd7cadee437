package main

import (
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The half message of one transaction ID is a register: absent, then
// pending, then committed or rolled back, once. The history's operations
// on it are checked for linearizability with porcupine: SendHalf, Commit,
// Rollback (an error that is not a refusal may or may not have taken
// effect), the checker's answers to check-backs (the broker may apply them
// at any time after), and deliveries, which read "committed". A delivery
// is placed at its handler's start, later than the broker sent it, so a
// delivery before the commit can be missed, never invented.

const (
	regAbsent = iota
	regPending
	regCommitted
	regRolledBack
)

type regOp struct {
	kind   string // half, commit, rollback, check-commit, check-rollback, deliver
	result string // ok, refused, unknown
}

// regStep is the register's transition: every state op may leave it in.
func regStep(state, input, _ any) []any {
	s, op := state.(int), input.(regOp)
	switch op.kind {
	case "half":
		if s == regAbsent {
			if op.result == "unknown" {
				return []any{regAbsent, regPending}
			}
			return []any{regPending}
		}
		return []any{s}
	case "commit", "check-commit":
		return resolve(s, op, regCommitted)
	case "rollback", "check-rollback":
		return resolve(s, op, regRolledBack)
	case "deliver":
		if s == regCommitted {
			return []any{s}
		}
	}
	return nil
}

// resolve is Commit or Rollback (to) from s: the first resolution wins, a
// repeat changes nothing, the other one is refused.
func resolve(s int, op regOp, to int) []any {
	switch {
	case op.result == "refused":
		if s != to {
			return []any{s}
		}
		return nil
	case op.result == "unknown" || strings.HasPrefix(op.kind, "check-"):
		if s == regPending {
			return []any{s, to}
		}
		return []any{s}
	case s == regPending || s == to:
		return []any{to}
	}
	return nil
}

var registerModel = (&porcupine.NondeterministicModel{
	Init:  func() []any { return []any{regAbsent} },
	Step:  regStep,
	Equal: func(a, b any) bool { return a == b },
}).ToModel()

// Linearize checks every transaction's register and returns the IDs of
// those whose history is not linearizable (or whose check timed out).
func Linearize(events []Event) []string {
	var end time.Time
	ops := map[string][]porcupine.Operation{}
	add := func(tx string, op regOp, call, ret time.Time) {
		ops[tx] = append(ops[tx], porcupine.Operation{Input: op, Call: call.UnixNano(), Return: ret.UnixNano()})
	}
	for _, e := range events {
		end = maxTime(end, e.T, e.End)
	}
	never := end.Add(time.Second) // an operation that may take effect at any time
	for _, e := range events {
		switch {
		case e.Kind == evTx:
			txOps(e, never, add)
		case e.Kind == evCheck:
			add(e.TxID, regOp{kind: "check-" + e.Outcome, result: "ok"}, e.T, never)
		case e.Kind == evDeliver && e.TxID != "":
			add(e.TxID, regOp{kind: "deliver", result: "ok"}, e.T, e.T)
		}
	}
	var bad []string
	for tx, h := range ops {
		if porcupine.CheckOperationsTimeout(registerModel, h, 10*time.Second) != porcupine.Ok {
			bad = append(bad, tx)
		}
	}
	slices.Sort(bad)
	return bad
}

// txOps adds a transaction's SendHalf and its Commit or Rollback.
func txOps(e Event, never time.Time, add func(string, regOp, time.Time, time.Time)) {
	if e.Outcome == txAborted {
		add(e.TxID, regOp{kind: "half", result: "unknown"}, e.T, never)
		return
	}
	add(e.TxID, regOp{kind: "half", result: "ok"}, e.T, e.Mid)
	kind := map[string]string{txCommit: "commit", txRollback: "rollback"}[e.Outcome]
	if kind == "" {
		return // crashed: no call
	}
	switch {
	case e.OK:
		add(e.TxID, regOp{kind: kind, result: "ok"}, e.Mid, e.End)
	case strings.Contains(e.Err, "conflict"):
		add(e.TxID, regOp{kind: kind, result: "refused"}, e.Mid, e.End)
	default:
		add(e.TxID, regOp{kind: kind, result: "unknown"}, e.Mid, never)
	}
}

func maxTime(ts ...time.Time) time.Time {
	var m time.Time
	for _, t := range ts {
		if t.After(m) {
			m = t
		}
	}
	return m
}
