package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"time"
)

// The seed's SLO for "eventual" (P95 < 5 s, P99 < 10 s end to end), and
// txmq's own goal at steady load.
const (
	sloP95  = 5 * time.Second
	sloP99  = 10 * time.Second
	goalP99 = 10 * time.Millisecond
)

// drillFlags are the drill command's flags.
type drillFlags struct {
	scheme   string
	short    bool
	faultFor time.Duration
	rate     int
	verbose  bool
	cfg      drillConfig
}

func parseDrillFlags(args []string) (names []string, f drillFlags, err error) {
	fs := flag.NewFlagSet("drill", flag.ContinueOnError)
	fs.StringVar(&f.scheme, "scheme", "both", "tx, outbox or both")
	fs.BoolVar(&f.short, "short", false, "fault windows of seconds: --fault-for 3s, 2 s of steady load before and after")
	fs.DurationVar(&f.faultFor, "fault-for", 5*time.Minute, "how long the fault lasts (not the duplicates drill)")
	fs.IntVar(&f.rate, "rate", 20, "orders paid per second")
	fs.BoolVar(&f.verbose, "v", false, "the services' logs on stderr")
	dup := fs.Uint("duplicates", 50, "deliveries of each message in the duplicates drill")
	fs.StringVar(&f.cfg.Addr, "addr", "", "an external broker (default: one in this process; broker-down needs that)")
	fs.StringVar(&f.cfg.OrdersDSN, "orders-dsn", "", "the orders database (default: SQLite in a temp dir)")
	fs.StringVar(&f.cfg.PointsDSN, "points-dsn", "", "the points database (default: SQLite in a temp dir)")
	fs.DurationVar(&f.cfg.ReconcileEvery, "reconcile-every", 2*time.Second, "reconciliation interval (5 min in production)")
	fs.DurationVar(&f.cfg.ReconcileGrace, "reconcile-grace", 0,
		"newest part of the window reconciliation leaves alone (default: the fault's length plus 10 s, so that it does not race the messages the fault delayed)")
	// Flags may come after the drill's name.
	var rest []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			return nil, f, err
		}
		if fs.NArg() == 0 {
			break
		}
		rest = append(rest, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(rest) != 1 {
		return nil, f, fmt.Errorf("drill takes one NAME or all; the drills: %s", strings.Join(drillNames, ", "))
	}
	names = []string{rest[0]}
	if rest[0] == "all" {
		names = drillNames
	}
	f.cfg.Duplicates = uint32(*dup)
	if f.short {
		f.faultFor = 3 * time.Second
	}
	if f.cfg.ReconcileGrace == 0 {
		f.cfg.ReconcileGrace = f.faultFor + 10*time.Second
	}
	return names, f, nil
}

func drillMain(ctx context.Context, args []string, out io.Writer) error {
	names, f, err := parseDrillFlags(args)
	if err != nil {
		return err
	}
	schemes := []string{schemeTx, schemeOutbox}
	if f.scheme != "both" {
		schemes = []string{f.scheme}
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if f.verbose {
		log = newLogger(false)
	}
	fmt.Fprintf(out, "# txmq drills: %s, %d cores, %s; fault %v, %d orders/s, reconciliation every %v (grace %v)\n\n",
		time.Now().UTC().Format("2006-01-02 15:04 MST"), runtime.NumCPU(), runtime.Version(), f.faultFor, f.rate,
		f.cfg.ReconcileEvery, f.cfg.ReconcileGrace)
	printHeader(out)
	var failed []string
	var results []drillResult
	for _, name := range names {
		for _, scheme := range schemes {
			cfg := f.cfg
			cfg.Name, cfg.Scheme, cfg.FaultFor, cfg.Rate, cfg.Log = name, scheme, f.faultFor, f.rate, log
			cfg.Warmup, cfg.Cooldown = 2*time.Second, 2*time.Second
			if !f.short {
				cfg.Warmup, cfg.Cooldown = 10*time.Second, 10*time.Second
			}
			if cfg.Dir, err = os.MkdirTemp("", "txmq-drill-"); err != nil {
				return err
			}
			cfg.removeDir = true
			res, err := runDrill(ctx, cfg)
			if err != nil {
				return fmt.Errorf("drill %s (%s): %w", name, scheme, err)
			}
			printResult(out, res)
			results = append(results, res)
			if !res.passed() {
				failed = append(failed, name+"/"+scheme)
			}
		}
	}
	printNotes(out, results)
	if len(failed) > 0 {
		return fmt.Errorf("drills failed: %s", strings.Join(failed, ", "))
	}
	return nil
}

func printHeader(out io.Writer) {
	fmt.Fprintln(out, "| drill | scheme | orders | completeness | duplicates applied | ghosts | compensations | recovery | p50 | p95 | p99 | steady p99 | seed SLO (P95 < 5 s, P99 < 10 s) | txmq goal (steady P99 ≤ 10 ms) | result |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
}

func printResult(out io.Writer, r drillResult) {
	verdict := "PASS"
	if !r.passed() {
		verdict = "FAIL"
	}
	fmt.Fprintf(out, "| %s | %s | %d | %.1f %% | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n",
		r.Drill, r.Scheme, r.Orders, r.completeness(), r.Duplicates, r.Ghosts, r.Actions, ms(r.Recovery),
		ms(r.All.P50), ms(r.All.P95), ms(r.All.P99), ms(r.Steady.P99),
		met(r.All.P95 < sloP95 && r.All.P99 < sloP99), met(r.Steady.N > 0 && r.Steady.P99 <= goalP99), verdict)
}

// printNotes says, under the table, what each drill's fault did.
func printNotes(out io.Writer, results []drillResult) {
	fmt.Fprintln(out)
	for _, r := range results {
		fmt.Fprintf(out, "- %s, %s: %s\n", r.Drill, r.Scheme, r.Note)
	}
}

func ms(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}
