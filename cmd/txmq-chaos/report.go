package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// printReport prints the figures of a run, the must-be-0 ones first.
func printReport(out io.Writer, cfg Config, r Report) {
	verdict := func(ok bool) string {
		if ok {
			return "ok"
		}
		return "FAIL"
	}
	fmt.Fprintf(out, "\n== txmq-chaos: %d nodes, faults %s, %s\n", cfg.Nodes, strings.Join(cfg.Faults, ","), r.Elapsed.Round(time.Second))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "operations\t%d transactions (%d committed in the truth), %d sends (%d acknowledged), %d deliveries\t\n",
		r.Transactions, r.Committed, r.Sends, r.AckedSends, r.Deliveries)
	fmt.Fprintf(tw, "lost\t%d\t%s\n", len(r.Lost), verdict(len(r.Lost) == 0))
	fmt.Fprintf(tw, "ghosts\t%d\t%s\n", len(r.Ghosts), verdict(len(r.Ghosts) == 0))
	fmt.Fprintf(tw, "pending left\t%d (expired %d)\t%s\n", r.PendingLeft, r.Expired, verdict(r.PendingLeft == 0))
	fmt.Fprintf(tw, "not linearizable (half message per tx)\t%d of %d\t%s\n", len(r.NonLinearizable), r.Transactions, verdict(len(r.NonLinearizable) == 0))
	fmt.Fprintf(tw, "converged\t%s\t%s\n", yesNo(r.Converged), verdict(r.Converged))
	fmt.Fprintf(tw, "ordering violations\t%d\t\n", len(r.OrderViolations))
	fmt.Fprintf(tw, "redelivered after ack\t%d (%.2f per 1,000 deliveries)\t\n", r.RedeliveredAfterAck, r.DupPer1k())
	fmt.Fprintf(tw, "send keys stored twice\t%d\t\n", r.KeyDuplicates)
	fmt.Fprintf(tw, "max attempt\t%d\t\n", r.MaxAttempt)
	tw.Flush()
	fmt.Fprintf(out, "converge: %s\n", r.ConvergeDetail)
	fmt.Fprintf(out, "raft connections through the proxies: %d (dialer not told, so no link fault: %d)\n", r.Proxied, r.UnknownDialer)
	printOutages(out, r.Outages)
	for _, c := range r.Corrupted {
		what := "started and caught up"
		if c.Refused {
			what = "refused to start (" + c.Reason + "); wiped and rejoined"
		}
		fmt.Fprintf(out, "corrupt %s on %s: %s: %s\n", c.Variant, c.Node, c.Damage, what)
	}
	for _, s := range r.Skipped {
		fmt.Fprintln(out, "skipped", s)
	}
	for i, f := range r.OrderViolations {
		if i == 5 {
			break
		}
		fmt.Fprintf(out, "ordering: group %s: %s (%+v)\n", f.Group, f.Why, f.Op)
	}
	for _, f := range append(append([]Finding{}, r.Lost...), r.Ghosts...) {
		fmt.Fprintf(out, "VIOLATION group %s: %s: tx %q key %q msg %s outcome %s err %q\n",
			f.Group, f.Why, f.Op.TxID, f.Op.Key, f.Op.MsgID, f.Op.Outcome, f.Op.Err)
	}
	for i, tx := range r.NonLinearizable {
		if i == 10 {
			fmt.Fprintf(out, "... and %d more not linearizable\n", len(r.NonLinearizable)-10)
			break
		}
		fmt.Fprintf(out, "VIOLATION not linearizable: tx %s (its operations are in --history)\n", tx)
	}
	fmt.Fprintf(out, "result: %s\n", map[bool]string{true: "FAIL", false: "PASS"}[r.Failed()])
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printOutages prints each fault's outage (up to 40 of them), then the
// worst per nemesis and variant.
func printOutages(out io.Writer, outages []Outage) {
	if len(outages) == 0 {
		return
	}
	rec := func(d time.Duration) string {
		if d < 0 {
			return "none after heal"
		}
		return d.Round(time.Millisecond).String()
	}
	if len(outages) <= 40 {
		fmt.Fprintln(out, "\nfault\tlongest without a committed transaction\trecovery after heal")
		tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		for _, o := range outages {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", o.Fault, o.Longest.Round(time.Millisecond), rec(o.Recovery))
		}
		tw.Flush()
	}
	type worst struct {
		n                 int
		longest, recovery time.Duration
	}
	by := map[string]*worst{}
	var names []string
	for _, o := range outages {
		w := by[o.Nemesis]
		if w == nil {
			w = &worst{recovery: -1}
			by[o.Nemesis] = w
			names = append(names, o.Nemesis)
		}
		w.n++
		w.longest = max(w.longest, o.Longest)
		w.recovery = max(w.recovery, o.Recovery)
	}
	fmt.Fprintln(out, "\nnemesis\ttimes\tworst longest without a commit\tworst recovery after heal")
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	for _, name := range names {
		w := by[name]
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", name, w.n, w.longest.Round(time.Millisecond), rec(w.recovery))
	}
	tw.Flush()
}
