package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/internal/procs"
)

// The breakdown tables have a column per txmq run with a breakdown, the
// client's rows first and the derived ones last, a dash where a run has no
// such row, and proposals per entry as a count; the p99 table only the
// rows with a p99.
func TestBreakdownTable(t *testing.T) {
	var txmq []map[string]any
	for _, s := range []string{
		`{"workload":"tx","producers":1,"breakdown":[
			{"what":"client SendHalf","where":"client","count":10,"mean_us":2500,"p50_us":2000,"p99_us":9000},
			{"what":"proposals per log entry (a count)","where":"leader","count":30,"mean":1.5},
			{"what":"log store append","where":"leader","count":30,"mean_us":630,"p50_us":500,"p99_us":3100,"over_5ms":0},
			{"what":"client overhead SendHalf (client − handler)","where":"derived","mean_us":490}]}`,
		`{"workload":"send","producers":16,"breakdown":[
			{"what":"client Send","where":"client","count":10,"mean_us":5000,"p50_us":4000,"p99_us":12000},
			{"what":"log store append","where":"leader","count":30,"mean_us":720,"p50_us":600,"p99_us":4000,"over_5ms":2}]}`,
		`{"workload":"checkback","breakdown":[{"what":"log store append","where":"leader","mean_us":1}]}`,
		`{"workload":"tx","producers":16}`,
	} {
		var r map[string]any
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			t.Fatal(err)
		}
		txmq = append(txmq, r)
	}
	var b bytes.Buffer
	breakdownTable(&b, txmq)
	want := `
Where txmq's writes spent their time (txmq-bench --breakdown; means, ms):

| stage (where) | tx, 1 producers (SendHalf+Commit) | send, 16 producers |
|---|---:|---:|
| client SendHalf (client) | 2.50 | – |
| client Send (client) | – | 5.00 |
| proposals per log entry (a count) (leader) | 1.50 | – |
| log store append (leader) | 0.63 | 0.72 |
| client overhead SendHalf (client − handler) (derived) | 0.49 | – |

The slowest 1 % of each stage (p99, ms; the stages' read from their histograms' buckets, about 1.5× wide for Raft's and 2× for the handlers'):

| stage (where) | tx, 1 producers (SendHalf+Commit) | send, 16 producers |
|---|---:|---:|
| client SendHalf (client) | 9.00 | – |
| client Send (client) | – | 12.00 |
| log store append (leader) | 3.10 | 4.00 |

How many of each stage's samples took over 5 ms, the e2e target's p99 (of the stage's count; counted from the first bucket bound at or above 5 ms, 5.2 ms for Raft's stages and 8 ms for the handlers', so at least that many):

| stage (where) | tx, 1 producers (SendHalf+Commit) | send, 16 producers |
|---|---:|---:|
| log store append (leader) | 0 of 30 | 2 of 30 |
`
	if got := b.String(); got != want {
		t.Errorf("tables:\n%s\nwant:\n%s", got, want)
	}

	b.Reset()
	breakdownTable(&b, txmq[2:])
	if b.Len() != 0 {
		t.Errorf("no run with a breakdown, yet a table:\n%s", b.String())
	}
}

// The machine line gives txmq-bench's probes (the quorum appends only
// where the bench measured them), and nothing without them.
func TestMachineLine(t *testing.T) {
	var m map[string]any
	if err := json.Unmarshal([]byte(`{"workload":"machine","fsync_p50_us":104,"round_trip_p50_us":30.4,"round_trip_idle_p50_us":106}`), &m); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	machineLine(&b, []map[string]any{m})
	want := "write+fsync of a 4 KiB page p50 0.104 ms; a 64-byte round trip over loopback TCP between two processes p50 0.030 ms back to back, 0.106 ms after a 200 µs pause."
	if !strings.Contains(b.String(), want) {
		t.Errorf("got %q, want it to hold %q", b.String(), want)
	}
	if strings.Contains(b.String(), "log appends") {
		t.Errorf("no quorum probe in the machine object, yet %q", b.String())
	}

	m["quorum_append_p50_us"], m["quorum_append_p99_us"], m["quorum_append_max_us"] = 498.0, 1177.0, 67966.0
	m["quorum_append_at_once_p50_us"], m["quorum_append_at_once_p99_us"] = 404.0, 755.0
	b.Reset()
	machineLine(&b, []map[string]any{m})
	want = "the leader's, then the followers' until the first is done (hashicorp/raft's order), p50 0.498 ms, p99 1.177 ms, max 67.966 ms; all three at once (a leader that appends while it replicates), p50 0.404 ms, p99 0.755 ms."
	if !strings.Contains(b.String(), want) {
		t.Errorf("got %q, want it to hold %q", b.String(), want)
	}
	b.Reset()
	machineLine(&b, []map[string]any{{"workload": "tx", "producers": 1.0}})
	if b.Len() != 0 {
		t.Errorf("no machine object, yet %q", b.String())
	}
}

// The runs' table has, for txmq and NATS alike, how many of the machine's
// cores were busy and its context switches per operation, a dash where
// /proc/stat could not tell.
func TestRunsTableMachineColumns(t *testing.T) {
	var tx, send map[string]any
	if err := json.Unmarshal([]byte(`{"workload":"tx","producers":16,"throughput_per_s":5000,"txn_p50_us":2500,"txn_p99_us":9000,"txn_max_us":20000,
		"broker_cpu_cores":1.2,"broker_cpu_s_per_1000_writes":0.12,"machine_busy_cores":1.73,"machine_switches_per_op":10.54,"broker_peak_rss_mib":100,"loadavg_1m":3}`), &tx); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"workload":"send","producers":16,"throughput_per_s":12000,"send_p50_us":1100,"send_p99_us":4000,"send_max_us":9000,
		"broker_cpu_cores":1.1,"broker_cpu_s_per_1000_writes":0.09,"broker_peak_rss_mib":60,"loadavg_1m":3}`), &send); err != nil {
		t.Fatal(err)
	}
	nats := &result{Config: "always", Shape: "sync-16", Publishers: 16, Ops: 30000, Throughput: 5000, Measured: 6 * time.Second,
		cpu: 8 * time.Second, wall: 6 * time.Second, rss: 80 << 20, usageOK: true,
		machine: procs.Machine{Switches: 435000, Busy: 10380 * time.Millisecond}, machineOK: true, load: 4}
	nats.lat("publish", &hist{v: []time.Duration{2 * time.Millisecond}})
	var b bytes.Buffer
	report(&b, []*result{nats}, []map[string]any{tx, send})
	holds(t, b.String(),
		"| machine busy (cores) | context switches / op |",
		"| txmq 3 nodes | tx, 16 producers (SendHalf+Commit) | 5000 | 2.50 | 9.00 | 20.00 | 1.20 | 0.120 | 1.73 | 10.5 | 100 | 3.0 |",
		"| txmq 3 nodes | send, 16 producers | 12000 | 1.10 | 4.00 | 9.00 | 1.10 | 0.090 | – | – | 60 | 3.0 |",
		"| NATS R3 always | sync publish, 16 goroutines | 5000 | 2.00 | 2.00 | 2.00 | 1.33 | 0.267 | 1.73 | 14.5 | 80 | 4.0 |",
	)
}

// holds fails t for each of wants that out does not hold.
func holds(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
}

// Runs on one client, txmq's producers on one Producer (txmq-bench
// --one-producer) and NATS's publishers on one connection
// (sync-16-one-conn), are named so in the runs' table, and the targets,
// stated for a client each, take the runs with a client each.
func TestOneClientRunsAreNotTheTargets(t *testing.T) {
	var txOne, tx map[string]any
	if err := json.Unmarshal([]byte(`{"workload":"tx","producers":16,"one_producer":true,"throughput_per_s":6000,"txn_p50_us":2000,"txn_p99_us":8000,"txn_max_us":15000}`), &txOne); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(`{"workload":"tx","producers":16,"throughput_per_s":4000,"txn_p50_us":3000,"txn_p99_us":9000,"txn_max_us":20000}`), &tx); err != nil {
		t.Fatal(err)
	}
	natsRun := func(shape string, tput float64) *result {
		r := &result{Config: "always", Shape: shape, Publishers: 16, Throughput: tput, Measured: 6 * time.Second}
		r.lat("publish", &hist{v: []time.Duration{2 * time.Millisecond}})
		return r
	}
	var b bytes.Buffer
	report(&b, []*result{natsRun("sync-16-one-conn", 9000), natsRun("sync-16", 5000)}, []map[string]any{txOne, tx})
	holds(t, b.String(),
		"| txmq 3 nodes | tx, 16 producers on one Producer (SendHalf+Commit) | 6000 |",
		"| txmq 3 nodes | tx, 16 producers (SendHalf+Commit) | 4000 |",
		"| NATS R3 always | sync publish, 16 goroutines on one connection | 9000 |",
		"| tx/s (16 producers) ≥ NATS always sync publishes/s (16) | 4000 | 5000/s | 0.80 | no |",
	)
}
