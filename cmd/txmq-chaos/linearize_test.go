package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func tx(id, outcome string, start, mid, end float64, ok bool, err string) Event {
	return Event{Kind: evTx, TxID: id, Outcome: outcome, T: at(start), Mid: at(mid), End: at(end), OK: ok, Err: err}
}

func TestLinearize(t *testing.T) {
	h := []Event{
		// Committed, then delivered: fine.
		tx("ok", txCommit, 0, 1, 2, true, ""),
		deliver(3, "a", "ok", "", "m1", 1, "", true),
		// Crashed; the checker said commit; delivered after: fine.
		tx("checked", txCrashCommit, 0, 1, 1, true, ""),
		{Kind: evCheck, TxID: "checked", Outcome: txCommit, T: at(4)},
		deliver(5, "a", "checked", "", "m2", 2, "", true),
		// Commit failed without a refusal: it may have happened; delivered.
		tx("maybe", txCommit, 0, 1, 9, false, "unavailable"),
		deliver(10, "a", "maybe", "", "m3", 3, "", true),
		// Delivered before anyone committed it: not linearizable.
		tx("early", txCommit, 5, 6, 7, true, ""),
		deliver(5.5, "a", "early", "", "m4", 4, "", true),
		// Rolled back, then delivered: not linearizable.
		tx("ghost", txRollback, 0, 1, 2, true, ""),
		deliver(3, "a", "ghost", "", "m5", 5, "", true),
		// The checker said rollback, and a Commit was refused: fine.
		tx("refused", txCommit, 0, 1, 8, false, "txmq: conflict: rolled back"),
		{Kind: evCheck, TxID: "refused", Outcome: txRollback, T: at(1.5)},
		// Commit acknowledged although the checker's rollback came first
		// and could only have won: still linearizable, since the broker
		// may apply a check answer at any time after it (even never).
		tx("late", txCommit, 0, 2, 3, true, ""),
		{Kind: evCheck, TxID: "late", Outcome: txRollback, T: at(1)},
	}
	require.Equal(t, []string{"early", "ghost"}, Linearize(h))
}
