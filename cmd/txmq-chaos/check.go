package main

import (
	"cmp"
	"fmt"
	"slices"
	"time"
)

// Finding is one violation with the operation behind it.
type Finding struct {
	Group string
	Op    Event // the transaction, Send or delivery in question
	Why   string
}

// Outage is the longest time without a successful transaction that began
// under one fault, and how long the cluster took to serve again after it
// was healed.
type Outage struct {
	Fault    string
	Nemesis  string // the nemesis and variant that injected it
	Longest  time.Duration
	Recovery time.Duration // from the heal to the next successful transaction; -1: none
}

// Result is what the checker found in a history.
type Result struct {
	Transactions, Committed, Sends, AckedSends, Deliveries int
	Lost, Ghosts                                           []Finding
	OrderViolations                                        []Finding
	// RedeliveredAfterAck counts deliveries of a message the group's
	// handler had acked before (the ack may have been lost with its
	// stream; guarantee 6 forbids it only for an ack the broker confirmed).
	RedeliveredAfterAck int
	// KeyDuplicates counts Send keys stored under more than one message ID.
	KeyDuplicates int
	MaxAttempt    uint32
	Outages       []Outage
}

// DupPer1k is RedeliveredAfterAck per 1,000 deliveries.
func (r Result) DupPer1k() float64 {
	if r.Deliveries == 0 {
		return 0
	}
	return float64(r.RedeliveredAfterAck) * 1000 / float64(r.Deliveries)
}

// delivered is what one group received of one message.
type delivered struct {
	first Event
	acked bool
}

// Check reads a history: every transaction the truth committed and every
// acknowledged Send must have reached each of groups (else lost); no
// delivery may be of a transaction the truth did not commit, or of
// anything never sent (else a ghost); within a group, a delivery with an
// ordering key must not come after a later message of the same key was
// acked.
func Check(events []Event, groups []string) Result {
	var r Result
	txs := map[string]Event{}
	sends := map[string]Event{}
	got := map[string]map[string]*delivered{} // group → tx ID or send key → first delivery
	for _, g := range groups {
		got[g] = map[string]*delivered{}
	}
	sendIDs := map[string]map[string]bool{} // send key → message IDs delivered
	order := map[[2]string]uint64{}         // group, ordering key → highest acked sequence
	acked := map[[2]string]bool{}           // group, message ID → acked once
	for _, e := range events {
		switch e.Kind {
		case evTx:
			r.Transactions++
			txs[e.TxID] = e
			if committedInTruth(e.Outcome) {
				r.Committed++
			}
		case evSend:
			r.Sends++
			if e.OK {
				r.AckedSends++
			}
			if prev, ok := sends[e.Key]; !ok || !prev.OK {
				sends[e.Key] = e
			}
		case evDeliver:
			r.Deliveries++
			r.MaxAttempt = max(r.MaxAttempt, e.Attempt)
			id := e.TxID
			if id == "" {
				id = e.Key
				if sendIDs[id] == nil {
					sendIDs[id] = map[string]bool{}
				}
				sendIDs[id][e.MsgID] = true
			}
			if m := got[e.Group]; m != nil && m[id] == nil {
				m[id] = &delivered{first: e}
			}
			if d := got[e.Group][id]; d != nil && e.OK {
				d.acked = true
			}
			r.checkOrder(e, order, acked)
		}
	}
	r.findGhosts(events, txs, sends)
	r.findLost(groups, txs, sends, got)
	for _, ids := range sendIDs {
		r.KeyDuplicates += len(ids) - 1
	}
	r.Outages = outages(events)
	return r
}

func (r *Result) checkOrder(e Event, order map[[2]string]uint64, acked map[[2]string]bool) {
	mk := [2]string{e.Group, e.MsgID}
	if acked[mk] {
		r.RedeliveredAfterAck++
	}
	if e.OrderingKey != "" {
		k := [2]string{e.Group, e.OrderingKey}
		if hi := order[k]; e.Seq < hi && !acked[mk] {
			r.OrderViolations = append(r.OrderViolations, Finding{Group: e.Group, Op: e,
				Why: fmt.Sprintf("sequence %d of ordering key %s delivered after %d was acked", e.Seq, e.OrderingKey, hi)})
		}
		if e.OK {
			order[k] = max(order[k], e.Seq)
		}
	}
	if e.OK {
		acked[mk] = true
	}
}

func (r *Result) findGhosts(events []Event, txs, sends map[string]Event) {
	for _, e := range events {
		if e.Kind != evDeliver {
			continue
		}
		if e.TxID != "" {
			tx, ok := txs[e.TxID]
			switch {
			case !ok:
				r.Ghosts = append(r.Ghosts, Finding{Group: e.Group, Op: e, Why: "delivered a transaction that was never started"})
			case !committedInTruth(tx.Outcome):
				r.Ghosts = append(r.Ghosts, Finding{Group: e.Group, Op: tx,
					Why: fmt.Sprintf("delivered (message %s, attempt %d) though the local transaction's outcome is %s", e.MsgID, e.Attempt, tx.Outcome)})
			}
			continue
		}
		if _, ok := sends[e.Key]; !ok {
			r.Ghosts = append(r.Ghosts, Finding{Group: e.Group, Op: e, Why: "delivered a message that was never sent"})
		}
	}
}

func (r *Result) findLost(groups []string, txs, sends map[string]Event, got map[string]map[string]*delivered) {
	for _, g := range groups {
		for id, tx := range txs {
			if committedInTruth(tx.Outcome) && got[g][id] == nil {
				r.Lost = append(r.Lost, Finding{Group: g, Op: tx, Why: "committed in the local database, never delivered"})
			}
		}
		for key, s := range sends {
			if s.OK && got[g][key] == nil {
				r.Lost = append(r.Lost, Finding{Group: g, Op: s, Why: "Send acknowledged, never delivered"})
			}
		}
	}
}

// outages finds, for each fault (each time one was on), the longest gap between successful
// transactions (by their end) that overlaps the fault, and the time from
// its heal to the next successful transaction.
func outages(events []Event) []Outage {
	type window struct {
		fault, nemesis string
		on, heal       time.Time
	}
	var wins []window
	var ends []time.Time
	for _, e := range events {
		switch {
		case e.Kind == evFault:
			wins = append(wins, window{fault: e.Fault, nemesis: e.Nemesis, on: e.T})
		case e.Kind == evHeal:
			// The newest open window of that fault: the faults of a
			// combination overlap.
			for i := len(wins) - 1; i >= 0; i-- {
				if wins[i].fault == e.Fault && wins[i].heal.IsZero() {
					wins[i].heal = e.T
					break
				}
			}
		case e.Kind == evTx && e.OK && e.Outcome == txCommit:
			ends = append(ends, cmp.Or(e.End, e.T))
		}
	}
	slices.SortFunc(ends, time.Time.Compare)
	out := make([]Outage, 0, len(wins))
	for _, w := range wins {
		out = append(out, Outage{Fault: w.fault, Nemesis: w.nemesis, Recovery: -1})
		o := &out[len(out)-1]
		heal := w.heal
		if heal.IsZero() {
			heal = time.Now()
		}
		for i := 1; i < len(ends); i++ {
			if ends[i].After(w.on) && ends[i-1].Before(heal) {
				o.Longest = max(o.Longest, ends[i].Sub(ends[i-1]))
			}
		}
		if k, _ := slices.BinarySearchFunc(ends, heal, time.Time.Compare); k < len(ends) && !w.heal.IsZero() {
			o.Recovery = max(o.Recovery, ends[k].Sub(heal))
		}
	}
	return out
}
