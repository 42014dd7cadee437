package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The breakdown table has a column per txmq run with a breakdown, the
// client's rows first and the derived ones last, a dash where a run has no
// such row, and proposals per entry as a count.
func TestBreakdownTable(t *testing.T) {
	var txmq []map[string]any
	for _, s := range []string{
		`{"workload":"tx","producers":1,"breakdown":[
			{"what":"client SendHalf","where":"client","count":10,"mean_us":2500,"p50_us":2000},
			{"what":"proposals per log entry (a count)","where":"leader","count":30,"mean":1.5},
			{"what":"log store append","where":"leader","count":30,"mean_us":630,"p50_us":500},
			{"what":"client overhead SendHalf (client − handler)","where":"derived","mean_us":490}]}`,
		`{"workload":"send","producers":16,"breakdown":[
			{"what":"client Send","where":"client","count":10,"mean_us":5000,"p50_us":4000},
			{"what":"log store append","where":"leader","count":30,"mean_us":720,"p50_us":600}]}`,
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
	want := []string{
		"| stage (where) | tx, 1 producers (SendHalf+Commit) | send, 16 producers |",
		"|---|---:|---:|",
		"| client SendHalf (client) | 2.50 | – |",
		"| client Send (client) | – | 5.00 |",
		"| proposals per log entry (a count) (leader) | 1.50 | – |",
		"| log store append (leader) | 0.63 | 0.72 |",
		"| client overhead SendHalf (client − handler) (derived) | 0.49 | – |",
	}
	got := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(got) < len(want) {
		t.Fatalf("table:\n%s", b.String())
	}
	got = got[len(got)-len(want):]
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}

	b.Reset()
	breakdownTable(&b, txmq[2:])
	if b.Len() != 0 {
		t.Errorf("no run with a breakdown, yet a table:\n%s", b.String())
	}
}

// The machine line gives txmq-bench's probes, and nothing without them.
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
	b.Reset()
	machineLine(&b, []map[string]any{{"workload": "tx", "producers": 1.0}})
	if b.Len() != 0 {
		t.Errorf("no machine object, yet %q", b.String())
	}
}
