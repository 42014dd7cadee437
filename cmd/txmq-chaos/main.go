// Command txmq-chaos is txmq's fault suite: it starts a cluster of real
// broker processes on loopback, whose Raft traffic goes through TCP
// proxies in this process, runs a transactional workload through the Go
// client against it, injects faults (kill -9, SIGSTOP, partitions, one-way
// drops and delays, corrupt files, membership changes, power cuts, full
// and slow disks; one at a time or several at once), heals, drains, and
// checks the history against SEMANTICS.md's guarantees: nothing lost, no
// ghosts, nothing left pending, the stores converged. It exits 1 when a
// must-be-0 figure is not 0.
//
//	go run ./cmd/txmq-chaos --short
//	go run ./cmd/txmq-chaos --faults kill,partition --soak 30m
//	go run ./cmd/txmq-chaos --short --faults kill+partition   # both at once
//
// docs/reliability.md says what each fault models and holds the last runs.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, keep, err := parseFlags(args, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "txmq-chaos:", err)
		return 2
	}
	tmp := cfg.Dir == ""
	if tmp {
		if cfg.Dir, err = os.MkdirTemp("", "txmq-chaos-"); err != nil {
			fmt.Fprintln(stderr, "txmq-chaos:", err)
			return 2
		}
	}
	if cfg.BrokerBin == "" {
		cfg.BrokerBin = filepath.Join(cfg.Dir, "broker")
		out, err := exec.Command("go", "build", "-o", cfg.BrokerBin, "github.com/txmq/txmq/cmd/broker").CombinedOutput()
		if err != nil {
			fmt.Fprintf(stderr, "txmq-chaos: build the broker: %v\n%s", err, out)
			return 2
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Every run is bounded: the faults' schedule, the drain and the checks.
	ctx, cancel := context.WithTimeout(ctx, cfg.Duration+cfg.Drain+30*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "txmq-chaos:", err)
		fmt.Fprintln(stderr, "txmq-chaos: data and logs kept in", cfg.Dir)
		return 2
	}
	printReport(stdout, cfg, rep)
	if tmp && !keep && !rep.Failed() {
		os.RemoveAll(cfg.Dir)
	} else {
		fmt.Fprintln(stdout, "data and logs in", cfg.Dir)
	}
	if rep.Failed() {
		return 1
	}
	return 0
}

func parseFlags(args []string, out io.Writer) (Config, bool, error) {
	fs := flag.NewFlagSet("txmq-chaos", flag.ContinueOnError)
	fs.SetOutput(out)
	cfg := Config{Out: out}
	faults := fs.String("faults", "", "comma-separated faults to inject, in turn, out of "+strings.Join(allFaults, ", ")+"; faults joined by + are applied together (kill+partition) (default: all, then "+strings.Join(combinedFaults, ", ")+")")
	short := fs.Bool("short", false, "every variant of every fault once, held a few seconds (CI)")
	soak := fs.Duration("soak", 0, "rotate the faults for this long (same as --duration)")
	fs.DurationVar(&cfg.Duration, "duration", 0, "rotate the faults for this long; 0: each fault once")
	fs.DurationVar(&cfg.Hold, "hold", 5*time.Second, "how long each fault stays on")
	fs.DurationVar(&cfg.Interval, "interval", 5*time.Second, "calm between faults")
	fs.DurationVar(&cfg.Drain, "drain", 2*time.Minute, "bound of the drain after the faults")
	fs.IntVar(&cfg.Nodes, "nodes", 3, "broker processes: 3 or 5")
	fs.IntVar(&cfg.Producers, "producers", 3, "producers (each with a checker)")
	fs.StringVar(&cfg.BrokerBin, "broker-bin", "", "broker binary (default: go build ./cmd/broker)")
	fs.StringVar(&cfg.Dir, "dir", "", "where the nodes' data and logs go (default: a temporary directory, removed after a passing run)")
	fs.StringVar(&cfg.History, "history", "", "write every operation to this file, as JSON lines")
	fs.BoolVar(&cfg.BrokenFsync, "broken-fsync", false, "deliberately broken: on the lazy file system the wal's fsync lies (a power cut drops its last 3 s); the run must report lost writes")
	keep := fs.Bool("keep", false, "keep --dir's temporary directory after a passing run")
	if err := fs.Parse(args); err != nil {
		return cfg, false, err
	}
	if *soak > 0 {
		cfg.Duration = *soak
	}
	if *short {
		cfg.AllVariants = true
		cfg.Hold, cfg.Interval = 3*time.Second, 3*time.Second
	}
	if cfg.Nodes != 3 && cfg.Nodes != 5 {
		return cfg, false, fmt.Errorf("--nodes %d: 3 or 5", cfg.Nodes)
	}
	if cfg.Producers < 1 {
		return cfg, false, fmt.Errorf("--producers %d: at least 1", cfg.Producers)
	}
	if *faults == "" {
		cfg.Faults = append(slices.Clone(allFaults), combinedFaults...)
		return cfg, *keep, nil
	}
	for _, f := range strings.Split(*faults, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if _, err := nemesisFor(f); err != nil {
			return cfg, false, fmt.Errorf("--faults: %w", err)
		}
		cfg.Faults = append(cfg.Faults, f)
	}
	return cfg, *keep, nil
}
