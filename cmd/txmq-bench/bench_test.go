package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	txmq "github.com/txmq/txmq/client/go"
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
	for _, key := range []string{"fsync_p50_us", "quorum_append_p50_us", "quorum_append_at_once_p50_us", "round_trip_p50_us", "round_trip_idle_p50_us"} {
		if v, _ := objs[0][key].(float64); v <= 0 {
			b.Fatalf("machine: no %s: %v", key, objs[0])
		}
	}
	res := objs[1]
	if res["throughput_per_s"].(float64) <= 0 || res["errors"].(float64) != 0 {
		b.Fatalf("%s: no throughput or errors: %v", w, res)
	}
	for _, key := range []string{"broker_cpu_s", "broker_cpu_s_per_1000_writes", "machine_busy_cores", "machine_switches_per_op", "breakdown_leader", "stage_entry_write_mean_us"} {
		if _, ok := res[key]; !ok {
			b.Fatalf("%s: no %s: %v", w, key, res)
		}
	}
	// Every proposal in the window was timed, whatever the workload.
	if n, _ := res["stage_proposal_wait_count"].(float64); n <= 0 {
		b.Fatalf("%s: the breakdown saw no proposals: %v", w, res)
	}
	overhead := map[string]string{"tx": "overhead_commit_us", "tx-oneway": "overhead_half_us", "send": "overhead_send_us", "e2e": "overhead_half_us", "backlog": "overhead_half_us"}[w]
	if _, ok := res[overhead]; overhead != "" && !ok {
		b.Fatalf("%s: no %s: %v", w, overhead, res)
	}
	if w == "tx-oneway" {
		// The one-way commits reached the leader's session handler, and
		// the client's Commit, which did not wait for it, has no overhead.
		if n, _ := res["stage_session_commit_count"].(float64); n <= 0 {
			b.Fatalf("%s: no session_commit stage: %v", w, res)
		}
		if _, ok := res["overhead_commit_us"]; ok {
			b.Fatalf("%s: an overhead for the one-way Commit: %v", w, res)
		}
		if _, ok := res["deliver_p50_us"]; !ok {
			b.Fatalf("%s: no deliver latency: %v", w, res)
		}
	}
}

// TestCompareSecure runs tx with --tls --auth for two rounds on one
// in-process node: off, on, off, on, each without errors, the "on" ones
// marked tls and auth.
func TestCompareSecure(t *testing.T) {
	var out, errOut strings.Builder
	code := run([]string{"--inprocess", "--nodes", "1", "--workloads", "tx", "--producers", "2",
		"--duration", "300ms", "--warmup", "100ms", "--tls", "--auth", "--rounds", "2", "--dir", t.TempDir(), "-o", "json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var secure []bool
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	for sc.Scan() {
		var o map[string]any
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatalf("not JSON: %q: %v", sc.Text(), err)
		}
		if o["workload"] == "machine" {
			continue
		}
		if o["throughput_per_s"].(float64) <= 0 || o["errors"].(float64) != 0 {
			t.Fatalf("no throughput or errors: %v", o)
		}
		_, tls := o["tls"]
		_, auth := o["auth"]
		if tls != auth {
			t.Fatalf("tls %v but auth %v: %v", tls, auth, o)
		}
		secure = append(secure, tls)
	}
	if want := []bool{false, true, false, true}; !slices.Equal(secure, want) {
		t.Fatalf("runs secure: %v, want %v", secure, want)
	}
}

// TestBenchAuthEnforced: a broker started with the bench's auth file
// refuses a client without the token or with a wrong one, and serves one
// with it, also the checkback workload's admin calls.
func TestBenchAuthEnforced(t *testing.T) {
	dir := t.TempDir()
	ba, err := newBenchAuth(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	c, _, err := startCluster(ctx, clusterSpec{nodes: 1, inProcess: true, dir: dir, auth: ba, out: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for _, token := range []string{"", "wrong", ba.token} {
		p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: c.addrs(), Token: token, Logger: quiet, RetryTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		_, err = p.Send(ctx, txmq.Message{Topic: "bench-x", Body: []byte("x")})
		p.Close()
		if (token == ba.token) != (err == nil) {
			t.Fatalf("token %q: %v", token, err)
		}
		if err != nil && !errors.Is(err, txmq.ErrUnauthenticated) {
			t.Fatalf("token %q: want ErrUnauthenticated, got %v", token, err)
		}
	}
	admin, closeAdmin, err := adminClients(c.addrs(), nil, ba.token)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAdmin()
	if _, err := pending(ctx, admin, "bench-orphans-x"); err != nil {
		t.Fatal(err)
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
		{"--addr", "127.0.0.1:1", "--auth"},
		{"--tls", "--rounds", "0"},
		{"--local-tx", "-1ms"},
	} {
		var out, errOut strings.Builder
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("%v: exit %d, want 2 (%s)", args, code, errOut.String())
		}
	}
}

// --local-tx holds each transaction between SendHalf and Commit: the
// whole transaction takes at least that long, SendHalf and Commit do not
// count it, and the result says it.
func TestLocalTx(t *testing.T) {
	const local = 30 * time.Millisecond
	var out, errOut strings.Builder
	code := run([]string{"--inprocess", "--nodes", "1", "--workloads", "tx", "--producers", "2", "--local-tx", local.String(),
		"--duration", "500ms", "--warmup", "100ms", "--dir", t.TempDir(), "-o", "json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var res map[string]any
	for line := range strings.Lines(out.String()) {
		var o map[string]any
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("not JSON: %q: %v", line, err)
		}
		if o["workload"] == "tx" {
			res = o
		}
	}
	if res == nil {
		t.Fatalf("no tx result: %s", out.String())
	}
	ms := func(key string) float64 { return res[key].(float64) / 1e3 }
	if res["ops"].(float64) == 0 || res["errors"].(float64) != 0 {
		t.Fatalf("no transactions or errors: %v", res)
	}
	if got := res["local_tx_ms"]; got != 30.0 {
		t.Errorf("local_tx_ms %v, want 30", got)
	}
	if ms("txn_p50_us") < 30 {
		t.Errorf("a transaction took %.2f ms at the p50, less than its local transaction", ms("txn_p50_us"))
	}
	if ms("half_p50_us") >= 30 || ms("commit_p50_us") >= 30 {
		t.Errorf("SendHalf %.2f ms, Commit %.2f ms at the p50: the local transaction is in neither", ms("half_p50_us"), ms("commit_p50_us"))
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

// --one-producer runs a closed loop's producers as goroutines on one
// Producer: loopProducers hands every goroutine the same one, a run says
// so in both outputs, and its writes all succeed.
func TestOneProducer(t *testing.T) {
	for _, one := range []bool{false, true} {
		e := &env{o: &options{oneProducer: one}, c: remote{"127.0.0.1:1"}}
		ps, closeAll, err := e.loopProducers(3, txmq.ProducerConfig{ProducerGroup: "bench"})
		if err != nil {
			t.Fatal(err)
		}
		distinct := map[*txmq.Producer]bool{}
		for _, p := range ps {
			distinct[p] = true
		}
		closeAll()
		want := 3
		if one {
			want = 1
		}
		if len(ps) != 3 || len(distinct) != want {
			t.Errorf("one producer %v: %d producers, %d distinct; want 3, %d", one, len(ps), len(distinct), want)
		}
	}

	var out, errOut strings.Builder
	code := run([]string{"--inprocess", "--nodes", "1", "--workloads", "tx,send", "--producers", "3", "--one-producer",
		"--duration", "400ms", "--warmup", "100ms", "--dir", t.TempDir(), "-o", "json"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	runs := 0
	for line := range strings.Lines(out.String()) {
		var o map[string]any
		if err := json.Unmarshal([]byte(line), &o); err != nil {
			t.Fatalf("not JSON: %q: %v", line, err)
		}
		if o["workload"] != "tx" && o["workload"] != "send" {
			continue
		}
		runs++
		if o["one_producer"] != true || o["producers"] != 3.0 || o["ops"].(float64) == 0 || o["errors"].(float64) != 0 {
			t.Errorf("%v: one_producer %v, producers %v, ops %v, errors %v; want true, 3, some, 0", o["workload"], o["one_producer"], o["producers"], o["ops"], o["errors"])
		}
	}
	if runs != 2 {
		t.Fatalf("%d tx and send runs, want 2: %s", runs, out.String())
	}

	var table strings.Builder
	writeTable(&table, &result{Workload: "tx", Producers: 16, OneProducer: true, Cluster: "c"})
	if !strings.Contains(table.String(), "producers=16 (on one Producer)") {
		t.Errorf("the table does not say the producers shared one: %s", table.String())
	}
}
