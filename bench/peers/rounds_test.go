package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// roundFile writes one round's JSON lines to a file of their own.
func roundFile(t *testing.T, lines ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "round.json")
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

var (
	roundTxmq = []string{
		`{"workload":"machine","fsync_p50_us":70}`,
		`{"workload":"tx","producers":16,"throughput_per_s":5000,"txn_p50_us":2500}`,
		`{"workload":"send","producers":16,"throughput_per_s":12000}`,
		`{"workload":"e2e","producers":16,"rate_per_s":2000,"e2e_p99_us":6500}`,
	}
	roundNATS = []string{
		`{"peer":"nats-jetstream-r3","config":"default","workload":"sync-16","throughput_per_s":16000}`,
		`{"peer":"nats-jetstream-r3","config":"always","workload":"sync-16","throughput_per_s":6250}`,
	}
)

// A round's file yields txmq's and NATS's figures and which ran first;
// a file without both systems' runs, or with a line that is not JSON, is
// refused.
func TestReadRound(t *testing.T) {
	r, err := readRound(roundFile(t, append(roundTxmq, roundNATS...)...))
	if err != nil {
		t.Fatal(err)
	}
	want := round{tx: 5000, send: 12000, e2eP99: 6.5, always: 6250, deflt: 16000}
	if r != want {
		t.Errorf("round %+v, want %+v", r, want)
	}
	r, err = readRound(roundFile(t, append(roundNATS, roundTxmq...)...))
	if err != nil {
		t.Fatal(err)
	}
	if want.natsFirst = true; r != want {
		t.Errorf("NATS first: round %+v, want %+v", r, want)
	}
	// tx at 1 producer is not the target's run, nor NATS's sync-1.
	r, err = readRound(roundFile(t,
		`{"workload":"tx","producers":1,"throughput_per_s":800}`,
		`{"peer":"nats-jetstream-r3","config":"always","workload":"sync-1","throughput_per_s":1200}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.tx != 0 || r.always != 0 {
		t.Errorf("tx at 1 or sync-1 taken for the 16's: %+v", r)
	}
	// Nor are runs on one client: txmq's producers on one Producer, NATS's
	// publishers on one connection.
	r, err = readRound(roundFile(t,
		`{"workload":"tx","producers":16,"one_producer":true,"throughput_per_s":6000}`,
		`{"workload":"send","producers":16,"one_producer":true,"throughput_per_s":14000}`,
		`{"peer":"nats-jetstream-r3","config":"always","workload":"sync-16-one-conn","throughput_per_s":9000}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.tx != 0 || r.send != 0 || r.always != 0 {
		t.Errorf("runs on one client taken for the targets' runs: %+v", r)
	}
	for name, lines := range map[string][]string{
		"txmq only": roundTxmq,
		"NATS only": roundNATS,
		"not JSON":  {roundTxmq[1], "tx 5000", roundNATS[0]},
	} {
		if _, err := readRound(roundFile(t, lines...)); err == nil {
			t.Errorf("%s: read", name)
		}
	}
	if _, err := readRound(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Error("a missing file read")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		vs   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{0.9, 1.2, 0.7}, 0.9}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.vs); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.vs, got, c.want)
		}
	}
}

// The rounds' table has each round's figures and ratios, a dash for a run
// the round lacks, and for each target its median over the rounds, the
// rounds that met it, and whether the median does.
func TestRoundsTable(t *testing.T) {
	rounds := []round{
		{tx: 5000, always: 6250, send: 12000, deflt: 16000, e2eP99: 6.5},
		{natsFirst: true, tx: 5400, always: 5000, send: 13000, deflt: 13000, e2eP99: 4.9},
		{tx: 5200, always: 5780, send: 12500, e2eP99: 7.25},
	}
	var b bytes.Buffer
	roundsTable(&b, rounds)
	holds(t, b.String(),
		"| 1 | txmq | 5000 | 6250 | 0.80 | 12000 | 16000 | 0.75 | 6.50 |",
		"| 2 | NATS | 5400 | 5000 | 1.08 | 13000 | 13000 | 1.00 | 4.90 |",
		"| 3 | txmq | 5200 | 5780 | 0.90 | 12500 | – | – | 7.25 |",
		"| tx/s (16 producers) ÷ NATS always sync publishes/s (16), target ≥ 1 | 0.90 | 1 of 3 | no |",
		"| Send/s (16 producers) ÷ NATS default sync publishes/s (16), target ≥ 1 | 0.88 | 1 of 2 | no |",
		"| e2e p99 at 2,000/s, ms, target ≤ 5 | 6.50 | 1 of 3 | no |",
	)
	b.Reset()
	roundsTable(&b, nil)
	if b.Len() != 0 {
		t.Errorf("no rounds, yet %q", b.String())
	}
}

// Unknown NATS shapes and unreadable rounds are refused before anything
// starts.
func TestRunRefusesBadShapesAndRounds(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--shapes", "sync-16,sync-2"}, `--shapes: unknown "sync-2"`},
		{[]string{"--round", filepath.Join(t.TempDir(), "missing.json")}, "--round:"},
		{[]string{"--round", roundFile(t, roundTxmq...)}, "a round needs txmq-bench's runs and NATS's"},
	} {
		var stdout, stderr bytes.Buffer
		if rc := run(c.args, &stdout, &stderr); rc != 2 || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("run %v: rc %d, stderr %q; want 2 and %q", c.args, rc, stderr.String(), c.want)
		}
	}
}
