package main

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

// BenchmarkWorkloads is a smoke run of every workload with tiny sizes on one
// in-process node, with --breakdown, so that the bench keeps working; its
// figures mean nothing. CI runs it with -benchtime 1x. The real run is
// `make bench`.
func BenchmarkWorkloads(b *testing.B) {
	for _, w := range allWorkloads {
		b.Run(w, func(b *testing.B) {
			for b.Loop() {
				var out, errOut strings.Builder
				code := run([]string{"--inprocess", "--nodes", "1", "--workloads", w, "--producers", "2",
					"--duration", "300ms", "--warmup", "100ms", "--rate", "100", "--orphans", "20",
					"--backlog-pending", "200", "--backlog-committed", "1000", "--dir", b.TempDir(), "--breakdown", "-o", "json"}, &out, &errOut)
				if code != 0 {
					b.Fatalf("exit %d: %s", code, errOut.String())
				}
				checkJSON(b, w, strings.NewReader(out.String()))
			}
		})
	}
}

// checkJSON wants the machine line, then one result of workload w that
// did some work without errors.
func checkJSON(b *testing.B, w string, r io.Reader) {
	sc := bufio.NewScanner(r)
	var objs []map[string]any
	for sc.Scan() {
		var o map[string]any
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			b.Fatalf("not JSON: %q: %v", sc.Text(), err)
		}
		objs = append(objs, o)
	}
	if len(objs) != 2 || objs[0]["workload"] != "machine" || objs[1]["workload"] != w {
		b.Fatalf("want the machine and one %s object, got %v", w, objs)
	}
	res := objs[1]
	if res["throughput_per_s"].(float64) <= 0 || res["errors"].(float64) != 0 {
		b.Fatalf("%s: no throughput or errors: %v", w, res)
	}
	for _, key := range []string{"broker_cpu_s", "broker_cpu_s_per_1000_writes", "breakdown_leader", "stage_entry_write_mean_us"} {
		if _, ok := res[key]; !ok {
			b.Fatalf("%s: no %s: %v", w, key, res)
		}
	}
	// Every proposal in the window was timed, whatever the workload.
	if n, _ := res["stage_proposal_wait_count"].(float64); n <= 0 {
		b.Fatalf("%s: the breakdown saw no proposals: %v", w, res)
	}
	overhead := map[string]string{"tx": "overhead_commit_us", "send": "overhead_send_us", "e2e": "overhead_half_us", "backlog": "overhead_half_us"}[w]
	if _, ok := res[overhead]; overhead != "" && !ok {
		b.Fatalf("%s: no %s: %v", w, overhead, res)
	}
}

func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--workloads", "nope"},
		{"--nodes", "2"},
		{"--size", "4"},
		{"--producers", "0"},
		{"--addr", "127.0.0.1:1", "--workloads", "backlog"},
		{"--addr", "127.0.0.1:1", "--breakdown"},
		{"-o", "xml"},
	} {
		var out, errOut strings.Builder
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
}

func TestVersionFlag(t *testing.T) {
	var out, errOut strings.Builder
	if code := run([]string{"--version"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if !strings.HasPrefix(out.String(), "txmq-bench ") || !strings.Contains(out.String(), " go1.") {
		t.Errorf("--version printed %q", out.String())
	}
}
