package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// at is a time s seconds into a history.
func at(s float64) time.Time {
	return time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC).Add(time.Duration(s * float64(time.Second)))
}

func deliver(s float64, group, tx, key, msg string, seq uint64, okey string, acked bool) Event {
	return Event{T: at(s), End: at(s), Kind: evDeliver, Group: group, TxID: tx, Key: key, MsgID: msg, Seq: seq, OrderingKey: okey, OK: acked, Attempt: 1}
}

func TestCheckFindsLostAndGhosts(t *testing.T) {
	gs := []string{"a", "b"}
	h := []Event{
		{T: at(0), Kind: evTx, TxID: "t1", MsgID: "m1", Outcome: txCommit, OK: true},
		{T: at(0), Kind: evTx, TxID: "t2", MsgID: "m2", Outcome: txCrashCommit},
		{T: at(0), Kind: evTx, TxID: "t3", MsgID: "m3", Outcome: txRollback, OK: true},
		{T: at(0), Kind: evTx, TxID: "t4", Outcome: txAborted, Err: "unavailable"},
		{T: at(0), Kind: evSend, Key: "s1", MsgID: "m5", OK: true},
		{T: at(0), Kind: evSend, Key: "s2", Err: "unavailable"},
		deliver(1, "a", "t1", "", "m1", 1, "", true),
		deliver(1, "b", "t1", "", "m1", 1, "", true),
		deliver(1, "a", "t2", "", "m2", 2, "", true),
		// t2 never reaches b: lost. s1 reaches a only: lost for b.
		deliver(1, "a", "", "s1", "m5", 3, "", true),
		// t3 was rolled back in the truth: a ghost.
		deliver(2, "b", "t3", "", "m3", 4, "", true),
		// Nobody sent t9: a ghost too. s2 may or may not have been stored:
		// its delivery is neither lost nor a ghost.
		deliver(2, "a", "t9", "", "m9", 5, "", true),
		deliver(2, "a", "", "s2", "m6", 6, "", true),
	}
	r := Check(h, gs)
	require.Equal(t, 4, r.Transactions)
	require.Equal(t, 2, r.Committed)
	require.Equal(t, 2, r.Sends)
	require.Equal(t, 1, r.AckedSends)

	require.Len(t, r.Lost, 2)
	lost := map[string]string{}
	for _, f := range r.Lost {
		lost[f.Op.TxID+f.Op.Key] = f.Group
	}
	require.Equal(t, map[string]string{"t2": "b", "s1": "b"}, lost)

	require.Len(t, r.Ghosts, 2)
	ghosts := map[string]string{}
	for _, f := range r.Ghosts {
		ghosts[f.Op.TxID] = f.Why
	}
	require.Contains(t, ghosts["t3"], "rollback")
	require.Contains(t, ghosts["t9"], "never started")
}

func TestCheckOrderingAndRedelivery(t *testing.T) {
	h := []Event{
		{T: at(0), Kind: evSend, Key: "s1", MsgID: "m1", OK: true, OrderingKey: "k"},
		{T: at(0), Kind: evSend, Key: "s2", MsgID: "m2", OK: true, OrderingKey: "k"},
		{T: at(0), Kind: evSend, Key: "s3", MsgID: "m3", OK: true, OrderingKey: "k"},
		deliver(1, "a", "", "s1", "m1", 1, "k", false), // nacked: comes again
		deliver(2, "a", "", "s1", "m1", 1, "k", true),
		deliver(3, "a", "", "s3", "m3", 3, "k", true),
		deliver(4, "a", "", "s2", "m2", 2, "k", true), // after 3 was acked: out of order
		deliver(5, "a", "", "s3", "m3", 3, "k", true), // acked before: a duplicate
	}
	r := Check(h, []string{"a"})
	require.Empty(t, r.Lost)
	require.Empty(t, r.Ghosts)
	require.Len(t, r.OrderViolations, 1)
	require.Equal(t, "m2", r.OrderViolations[0].Op.MsgID)
	require.Equal(t, 1, r.RedeliveredAfterAck)
	require.InDelta(t, 200.0, r.DupPer1k(), 0.01)
}

func TestCheckOutages(t *testing.T) {
	ok := func(s float64) Event {
		return Event{T: at(s - 0.01), End: at(s), Kind: evTx, TxID: "t", Outcome: txCommit, OK: true}
	}
	h := []Event{
		ok(1), ok(2),
		{T: at(2.5), Kind: evFault, Fault: "kill"},
		{T: at(5), Kind: evHeal, Fault: "kill"},
		ok(6), // 4 s without a commit across the fault; 1 s after the heal
		ok(6.5),
		{T: at(7), Kind: evFault, Fault: "pause"},
		ok(7.2),
		{T: at(8), Kind: evHeal, Fault: "pause"},
		ok(8.5),
		// Two faults at once (a combination): each heal ends its own.
		{T: at(9), Kind: evFault, Fault: "kill n1"},
		{T: at(9), Kind: evFault, Fault: "cut n2"},
		{T: at(10), Kind: evHeal, Fault: "kill n1"},
		ok(10.2),
		{T: at(11), Kind: evHeal, Fault: "cut n2"},
		ok(11.5),
	}
	r := Check(h, nil)
	require.Equal(t, []Outage{
		{Fault: "kill", Longest: 4 * time.Second, Recovery: time.Second},
		{Fault: "pause", Longest: 1300 * time.Millisecond, Recovery: 500 * time.Millisecond},
		{Fault: "kill n1", Longest: 1700 * time.Millisecond, Recovery: 200 * time.Millisecond},
		{Fault: "cut n2", Longest: 1700 * time.Millisecond, Recovery: 500 * time.Millisecond},
	}, r.Outages)
}
