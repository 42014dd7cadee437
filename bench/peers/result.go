package main

import (
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/txmq/txmq/internal/procs"
)

// hist keeps every latency sample of a run; the percentiles are exact.
type hist struct {
	mu sync.Mutex
	v  []time.Duration
}

func (h *hist) add(d time.Duration) {
	h.mu.Lock()
	h.v = append(h.v, d)
	h.mu.Unlock()
}

type summary struct {
	Count              int
	P50, P95, P99, Max time.Duration
}

func (h *hist) summary() summary {
	h.mu.Lock()
	v := slices.Clone(h.v)
	h.mu.Unlock()
	if len(v) == 0 {
		return summary{}
	}
	slices.Sort(v)
	at := func(p float64) time.Duration { return v[int(p*float64(len(v)-1))] }
	return summary{Count: len(v), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: v[len(v)-1]}
}

// result is one NATS run.
type result struct {
	Config, Shape string
	Size          int
	Publishers    int
	Measured      time.Duration
	Ops, Errors   int64
	Throughput    float64
	Rate          float64
	Late, Missing int64
	latKey        string
	lats          summary

	cpu, wall time.Duration
	rss       uint64
	usageOK   bool
	machine   procs.Machine
	machineOK bool
	load      float64
}

func (r *result) lat(key string, h *hist) { r.latKey, r.lats = key, h.summary() }

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func (r *result) object() map[string]any {
	o := map[string]any{
		"peer":               "nats-jetstream-r3",
		"config":             r.Config,
		"workload":           r.Shape,
		"publishers":         r.Publishers,
		"size_bytes":         r.Size,
		"duration_s":         r.Measured.Seconds(),
		"ops":                r.Ops,
		"errors":             r.Errors,
		"throughput_per_s":   r.Throughput,
		r.latKey + "_p50_us": us(r.lats.P50),
		r.latKey + "_p95_us": us(r.lats.P95),
		r.latKey + "_p99_us": us(r.lats.P99),
		r.latKey + "_max_us": us(r.lats.Max),
	}
	if r.Rate > 0 {
		o["rate_per_s"], o["late_publishes"], o["missing"] = r.Rate, r.Late, r.Missing
	}
	if r.usageOK {
		o["server_cpu_s"] = r.cpu.Seconds()
		o["server_cpu_cores"] = r.cpu.Seconds() / r.wall.Seconds()
		o["server_peak_rss_mib"] = float64(r.rss) / (1 << 20)
		if r.Ops > 0 {
			o["server_cpu_s_per_1000_publishes"] = r.cpu.Seconds() / float64(r.Ops) * 1000
		}
	}
	if r.machineOK && r.wall > 0 && r.Ops > 0 {
		o["machine_busy_cores"] = r.machine.Busy.Seconds() / r.wall.Seconds()
		o["machine_switches_per_op"] = float64(r.machine.Switches) / float64(r.Ops)
	}
	return o
}

// perThousand prints a CPU-seconds-per-1,000 figure, "–" when missing.
func perThousand(v any) string { return fixed(v, 3) }

// fixed prints a figure with that many decimals, "–" when missing.
func fixed(v any, decimals int) string {
	f, ok := v.(float64)
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.*f", decimals, f)
}

func ms(us any) string {
	f, ok := us.(float64)
	if !ok {
		return "–"
	}
	return fmt.Sprintf("%.2f", f/1e3)
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

// onOneProducer: the run's producers were goroutines on one Producer
// (txmq-bench --one-producer), not the shape the targets are stated for.
func onOneProducer(r map[string]any) bool { return r["one_producer"] == true }

// txmqRun names a txmq run as the tables show it, with the key of its
// latencies; false for the runs they leave out.
func txmqRun(r map[string]any) (name, key string, ok bool) {
	producers := fmt.Sprintf("%v producers", r["producers"])
	if onOneProducer(r) {
		producers += " on one Producer"
	}
	switch r["workload"] {
	case "tx":
		return fmt.Sprintf("tx, %s (SendHalf+Commit)", producers), "txn", true
	case "tx-oneway":
		return fmt.Sprintf("tx one-way commit, %s (SendHalf+Commit sent)", producers), "txn", true
	case "send":
		return fmt.Sprintf("send, %s", producers), "send", true
	case "e2e":
		return fmt.Sprintf("e2e at %v/s (scheduled commit → consumer)", r["rate_per_s"]), "e2e", true
	}
	return "", "", false
}

// breakdownTable prints, for each txmq run with a breakdown (txmq-bench
// --breakdown), the mean of every row of it in ms (proposals per entry: a
// count): the client's latencies first, then the stages, then what is
// derived from them; then the p99 of the rows that have one, which shows
// which stage holds a run's slowest writes, and how many of each stage's
// took over 5 ms, which shows how often it was slow enough to hold the
// e2e p99 above its target.
func breakdownTable(w io.Writer, txmq []map[string]any) {
	stageTable(w, txmq, "\nWhere txmq's writes spent their time (txmq-bench --breakdown; means, ms):", func(row map[string]any) (string, bool) {
		if m, ok := row["mean"].(float64); ok {
			return fmt.Sprintf("%.2f", m), true
		}
		return ms(row["mean_us"]), true
	})
	stageTable(w, txmq, "\nThe slowest 1 % of each stage (p99, ms; the stages' read from their histograms' buckets, about 1.5× wide for Raft's and 2× for the handlers'):", func(row map[string]any) (string, bool) {
		if _, ok := row["p99_us"]; !ok {
			return "", false
		}
		return ms(row["p99_us"]), true
	})
	stageTable(w, txmq, "\nHow many of each stage's samples took over 5 ms, the e2e target's p99 (of the stage's count; counted from the first bucket bound at or above 5 ms, 5.2 ms for Raft's stages and 8 ms for the handlers', so at least that many):", func(row map[string]any) (string, bool) {
		n, ok := row["over_5ms"].(float64)
		if !ok {
			return "", false
		}
		return fmt.Sprintf("%.0f of %.0f", n, num(row["count"])), true
	})
}

// stageTable prints one table of the breakdowns' rows, a column per run,
// with the value val gives of each row; rows for which val gives nothing
// in every run are left out.
func stageTable(w io.Writer, txmq []map[string]any, title string, val func(row map[string]any) (string, bool)) {
	type column struct {
		name string
		vals map[string]string
	}
	var cols []column
	var clients, stages, derived []string
	seen := map[string]bool{}
	for _, r := range txmq {
		name, _, ok := txmqRun(r)
		rows, _ := r["breakdown"].([]any)
		if !ok || len(rows) == 0 {
			continue
		}
		c := column{name: name, vals: map[string]string{}}
		for _, x := range rows {
			row, _ := x.(map[string]any)
			v, ok := val(row)
			if !ok {
				continue
			}
			label := fmt.Sprintf("%v (%v)", row["what"], row["where"])
			if !seen[label] {
				seen[label] = true
				switch row["where"] {
				case "client":
					clients = append(clients, label)
				case "derived":
					derived = append(derived, label)
				default:
					stages = append(stages, label)
				}
			}
			c.vals[label] = v
		}
		cols = append(cols, c)
	}
	if len(seen) == 0 {
		return
	}
	fmt.Fprintln(w, title)
	fmt.Fprint(w, "\n| stage (where) |")
	for _, c := range cols {
		fmt.Fprintf(w, " %s |", c.name)
	}
	fmt.Fprint(w, "\n|---|")
	for range cols {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, label := range append(append(clients, stages...), derived...) {
		fmt.Fprintf(w, "| %s |", label)
		for _, c := range cols {
			v, ok := c.vals[label]
			if !ok {
				v = "–"
			}
			fmt.Fprintf(w, " %s |", v)
		}
		fmt.Fprintln(w)
	}
}

// report prints the machine's probes, txmq's comparable runs, NATS's, and
// the targets (run prints the rounds, txmq's breakdown and the floor
// after them).
func report(w io.Writer, nats []*result, txmq []map[string]any) {
	machineLine(w, txmq)
	fmt.Fprintln(w, "\n| system | run | ops/s | p50 ms | p99 ms | max ms | server CPU (cores) | server CPU s / 1,000 writes | machine busy (cores) | context switches / op | peak RSS MiB | load avg |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range txmq {
		name, key, ok := txmqRun(r)
		if !ok {
			continue
		}
		fmt.Fprintf(w, "| txmq 3 nodes | %s | %.0f | %s | %s | %s | %.2f | %s | %s | %s | %.0f | %.1f |\n", name, num(r["throughput_per_s"]),
			ms(r[key+"_p50_us"]), ms(r[key+"_p99_us"]), ms(r[key+"_max_us"]), num(r["broker_cpu_cores"]), perThousand(r["broker_cpu_s_per_1000_writes"]),
			fixed(r["machine_busy_cores"], 2), fixed(r["machine_switches_per_op"], 1), num(r["broker_peak_rss_mib"]), num(r["loadavg_1m"]))
	}
	for _, r := range nats {
		o := r.object()
		name := map[string]string{
			"sync-1":           "sync publish, 1 goroutine",
			"sync-16":          "sync publish, 16 goroutines",
			"sync-16-one-conn": "sync publish, 16 goroutines on one connection",
			"async":            "async publish, 1 goroutine",
			"e2e":              fmt.Sprintf("e2e at %.0f/s (scheduled publish → consumer)", r.Rate),
		}[r.Shape]
		fmt.Fprintf(w, "| NATS R3 %s | %s | %.0f | %s | %s | %s | %.2f | %s | %s | %s | %.0f | %.1f |\n", r.Config, name, r.Throughput,
			ms(o[r.latKey+"_p50_us"]), ms(o[r.latKey+"_p99_us"]), ms(o[r.latKey+"_max_us"]), num(o["server_cpu_cores"]), perThousand(o["server_cpu_s_per_1000_publishes"]),
			fixed(o["machine_busy_cores"], 2), fixed(o["machine_switches_per_op"], 1), num(o["server_peak_rss_mib"]), r.load)
	}
	if len(txmq) == 0 {
		return
	}
	natsRun := func(cfg, shape string) *result {
		for _, r := range nats {
			if r.Config == cfg && r.Shape == shape {
				return r
			}
		}
		return nil
	}
	fmt.Fprintln(w, "\n| target | txmq | compared with | ratio | met |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---|")
	row := func(target string, txmqV, other float64, otherS string, higherBetter bool, limit float64) {
		ratio := txmqV / other
		met := ratio >= limit
		if !higherBetter {
			met = ratio <= limit
		}
		fmt.Fprintf(w, "| %s | %.4g | %s | %.2f | %s |\n", target, txmqV, otherS, ratio, yes(met))
	}
	if tx, err := find(txmq, "tx", 16); err == nil {
		if n := natsRun("always", "sync-16"); n != nil {
			row("tx/s (16 producers) ≥ NATS always sync publishes/s (16)", num(tx["throughput_per_s"]), n.Throughput, fmt.Sprintf("%.0f/s", n.Throughput), true, 1)
		}
	}
	if s, err := find(txmq, "send", 16); err == nil {
		if n := natsRun("default", "sync-16"); n != nil {
			row("Send/s (16 producers) ≥ NATS default sync publishes/s (16)", num(s["throughput_per_s"]), n.Throughput, fmt.Sprintf("%.0f/s", n.Throughput), true, 1)
		}
	}
	if tx, err := find(txmq, "tx", 1); err == nil {
		row("p50 transaction, 1 producer ≤ 2.0 ms (durable commit)", num(tx["txn_p50_us"])/1e3, 2, "2.0 ms", false, 1)
	}
	if tx, err := find(txmq, "tx-oneway", 1); err == nil {
		row("p50 transaction, 1 producer, one-way commit ≤ 1.2 ms", num(tx["txn_p50_us"])/1e3, 1.2, "1.2 ms", false, 1)
	}
	if e, err := find(txmq, "e2e", 0); err == nil {
		p99 := num(e["e2e_p99_us"]) / 1e3
		row("e2e p99 ≤ 5 ms", p99, 5, "5 ms", false, 1)
		for _, cfg := range []string{"default", "always"} {
			if n := natsRun(cfg, "e2e"); n != nil {
				np := us(n.lats.P99) / 1e3
				row("e2e p99 ≤ NATS "+cfg+" e2e p99", p99, np, fmt.Sprintf("%.2f ms", np), false, 1)
			}
		}
	}
	if c, err := find(txmq, "checkback", 0); err == nil {
		row("check-back ≥ 5,000 resolved/s", num(c["throughput_per_s"]), 5000, "5,000/s", true, 1)
	}
	if b, err := find(txmq, "backlog", 0); err == nil {
		fmt.Fprintf(w, "| backlog (%.0f pending, %.0f committed): txn p99 ≤ 1.2× empty | %s ms | %s ms | %.2f | %s |\n",
			num(b["backlog_pending"]), num(b["backlog_committed"]), ms(b["txn_p99_us"]), ms(b["empty_txn_p99_us"]),
			num(b["txn_p99_vs_empty"]), yes(num(b["txn_p99_vs_empty"]) <= 1.2))
		if h, ok := b["broker_peak_heap_mib"].(float64); ok {
			fmt.Fprintf(w, "| backlog: broker heap ≤ 256 MiB | %.0f MiB | 256 MiB | %.2f | %s |\n", h, h/256, yes(h <= 256))
		}
	}
}

// machineLine prints what txmq-bench's probes found before its runs (its
// "machine" object): the floors under a write's fsyncs, log appends and
// crossings.
func machineLine(w io.Writer, txmq []map[string]any) {
	m, err := find(txmq, "machine", 0)
	if err != nil {
		return
	}
	fmt.Fprintf(w, "\nThe machine, probed by txmq-bench before its runs: write+fsync of a 4 KiB page p50 %.3f ms; a 64-byte round trip over loopback TCP between two processes p50 %.3f ms back to back, %.3f ms after a 200 µs pause.\n",
		num(m["fsync_p50_us"])/1e3, num(m["round_trip_p50_us"])/1e3, num(m["round_trip_idle_p50_us"])/1e3)
	if _, ok := m["quorum_append_p50_us"]; ok {
		fmt.Fprintf(w, "\nA write's log appends alone, on three of txmq's logs on this disk: the leader's, then the followers' until the first is done (hashicorp/raft's order), p50 %.3f ms, p99 %.3f ms, max %.3f ms; all three at once (a leader that appends while it replicates), p50 %.3f ms, p99 %.3f ms.\n",
			num(m["quorum_append_p50_us"])/1e3, num(m["quorum_append_p99_us"])/1e3, num(m["quorum_append_max_us"])/1e3,
			num(m["quorum_append_at_once_p50_us"])/1e3, num(m["quorum_append_at_once_p99_us"])/1e3)
	}
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
