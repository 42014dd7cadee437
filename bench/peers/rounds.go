package main

import (
	"fmt"
	"io"
	"slices"
)

// A round is one of make bench-peers' alternated rounds
// (scripts/bench-rounds.sh): txmq-bench's transactions, Sends and e2e run
// at 16 producers and NATS's sync publishes at 16 with both fsync
// settings, one system right after the other, the order swapped every
// round. One run of each system minutes apart tells the machine's drift
// as much as the systems (NATS `always` ranged 5,009-7,475 publishes/s
// over four runs of one evening, docs/benchmarks.md); the rounds' median
// ratios tell the systems.
type round struct {
	// natsFirst: NATS ran before txmq in this round.
	natsFirst bool
	// tx and send are txmq's transactions and Sends a second at 16
	// producers, e2eP99 its e2e p99 in ms; always and deflt are NATS's
	// sync publishes a second at 16 with sync_interval: always and with
	// its default. Zero: the round has no such run.
	tx, send, e2eP99, always, deflt float64
}

// readRound reads one round's file: the JSON lines of txmq-bench -o json
// and of peers -o json, in the order they ran.
func readRound(path string) (round, error) {
	lines, err := readJSONLines(path)
	if err != nil {
		return round{}, err
	}
	var r round
	firstTxmq, firstNATS := -1, -1
	for i, l := range lines {
		if l["peer"] != nil {
			if firstNATS < 0 {
				firstNATS = i
			}
			if l["workload"] != "sync-16" {
				continue
			}
			switch l["config"] {
			case "always":
				r.always = num(l["throughput_per_s"])
			case "default":
				r.deflt = num(l["throughput_per_s"])
			}
			continue
		}
		if _, _, ok := txmqRun(l); !ok {
			continue
		}
		if firstTxmq < 0 {
			firstTxmq = i
		}
		switch {
		case onOneProducer(l):
			// Left out: not the targets' shape.
		case l["workload"] == "tx" && l["producers"] == 16.0:
			r.tx = num(l["throughput_per_s"])
		case l["workload"] == "send" && l["producers"] == 16.0:
			r.send = num(l["throughput_per_s"])
		case l["workload"] == "e2e":
			r.e2eP99 = num(l["e2e_p99_us"]) / 1e3
		}
	}
	if firstTxmq < 0 || firstNATS < 0 {
		return round{}, fmt.Errorf("%s: a round needs txmq-bench's runs and NATS's", path)
	}
	r.natsFirst = firstNATS < firstTxmq
	return r, nil
}

// roundTarget is one target the rounds tell: its figure in each round
// (zero where the round lacks a run) and whether a figure meets it.
type roundTarget struct {
	name string
	of   func(round) float64
	met  func(float64) bool
}

// ratio is a ÷ b, zero where either was not measured (a round's missing
// figures are zero).
func ratio(a, b float64) float64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	return a / b
}

// known is a round's figure for fixed: nil, printed as a dash, where the
// round has none.
func known(v float64) any {
	if v <= 0 {
		return nil
	}
	return v
}

var roundTargets = []roundTarget{
	{"tx/s (16 producers) ÷ NATS always sync publishes/s (16), target ≥ 1",
		func(r round) float64 { return ratio(r.tx, r.always) },
		func(v float64) bool { return v >= 1 }},
	{"Send/s (16 producers) ÷ NATS default sync publishes/s (16), target ≥ 1",
		func(r round) float64 { return ratio(r.send, r.deflt) },
		func(v float64) bool { return v >= 1 }},
	{"e2e p99 at 2,000/s, ms, target ≤ 5",
		func(r round) float64 { return r.e2eP99 },
		func(v float64) bool { return v <= 5 }},
}

// median is the middle of vs (the mean of the two middle ones for an
// even count).
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// roundsTable prints each round's figures, then, for each target, its
// median over the rounds and in how many rounds it was met.
func roundsTable(w io.Writer, rounds []round) {
	if len(rounds) == 0 {
		return
	}
	fmt.Fprintf(w, "\nAlternated rounds (scripts/bench-rounds.sh): txmq's tx, send and e2e, and NATS's sync publishes at 16 with both fsync settings, one right after the other, the order swapped every round:\n")
	fmt.Fprintln(w, "\n| round | first | txmq tx/s (16) | NATS always /s (16) | ratio | txmq Send/s (16) | NATS default /s (16) | ratio | txmq e2e p99 ms |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
	for i, r := range rounds {
		first := "txmq"
		if r.natsFirst {
			first = "NATS"
		}
		fmt.Fprintf(w, "| %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", i+1, first,
			fixed(known(r.tx), 0), fixed(known(r.always), 0), fixed(known(ratio(r.tx, r.always)), 2),
			fixed(known(r.send), 0), fixed(known(r.deflt), 0), fixed(known(ratio(r.send, r.deflt)), 2),
			fixed(known(r.e2eP99), 2))
	}
	fmt.Fprintln(w, "\n| target, over the alternated rounds | median | met in | met (median) |")
	fmt.Fprintln(w, "|---|---:|---:|---|")
	for _, t := range roundTargets {
		var vs []float64
		met := 0
		for _, r := range rounds {
			if v := t.of(r); v > 0 {
				vs = append(vs, v)
				if t.met(v) {
					met++
				}
			}
		}
		if len(vs) == 0 {
			continue
		}
		m := median(vs)
		fmt.Fprintf(w, "| %s | %.2f | %d of %d | %s |\n", t.name, m, met, len(vs), yes(t.met(m)))
	}
}
