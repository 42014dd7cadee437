package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const floorOutput = `goos: linux
goarch: amd64
pkg: github.com/txmq/txmq/raftlog
BenchmarkRaftFloor/in-leader/processes=3/writers=16-2        	       1	         2.645 p50-ms	        12.53 p99-ms	      5313 writes/s
BenchmarkRaftFloor/grpc-client/processes=3/writers=1-2       	       1	         0.7970 p50-ms	         3.993 p99-ms	      1084 writes/s
BenchmarkRaftFloor/grpc-client/processes=3/writers=16-2      	       1	         2.271 p50-ms	        12.44 p99-ms	      6054 writes/s
BenchmarkRaftFloor/in-leader/processes=1/writers=16-2        	       1	         1.592 p50-ms	         9.730 p99-ms	      8390 writes/s
PASS
ok  	github.com/txmq/txmq/raftlog	29.347s
`

func TestReadFloor(t *testing.T) {
	runs, err := readFloor(strings.NewReader(floorOutput))
	if err != nil {
		t.Fatal(err)
	}
	want := []floorRun{
		{"in-leader", 3, 16, 5313, 2.645, 12.53},
		{"grpc-client", 3, 1, 1084, 0.797, 3.993},
		{"grpc-client", 3, 16, 6054, 2.271, 12.44},
		{"in-leader", 1, 16, 8390, 1.592, 9.73},
	}
	if len(runs) != len(want) {
		t.Fatalf("runs %+v, want %+v", runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Errorf("run %d: %+v, want %+v", i, runs[i], want[i])
		}
	}
	for _, bad := range []string{
		"PASS\n",
		"BenchmarkRaftFloor/in-leader/processes=3/writers=1-2  1  0.79 p50-ms  3.9 p99-ms\n",
		"BenchmarkRaftFloor/in-leader/processes=3/writers=1-2  1  x p50-ms  3.9 p99-ms  1084 writes/s\n",
		"BenchmarkRaftFloor/processes=3/writers=1-2  1  0.79 p50-ms  3.9 p99-ms  1084 writes/s\n",
		"BenchmarkRaftFloor/in-leader/processes=x/writers=1-2  1  0.79 p50-ms  3.9 p99-ms  1084 writes/s\n",
	} {
		if _, err := readFloor(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The floor table sets txmq's writes beside the floor's shaped as txmq
// runs (grpc-client, three voter processes), and the floor's best
// transaction rate beside NATS always.
func TestFloorTable(t *testing.T) {
	floor, err := readFloor(strings.NewReader(floorOutput))
	if err != nil {
		t.Fatal(err)
	}
	var txmq []map[string]any
	for _, s := range []string{
		`{"workload":"tx","producers":16,"throughput_per_s":1500}`,
		`{"workload":"tx","producers":1,"throughput_per_s":300,"txn_p50_us":3000}`,
		`{"workload":"send","producers":16,"throughput_per_s":3027}`,
	} {
		var r map[string]any
		if err := json.Unmarshal([]byte(s), &r); err != nil {
			t.Fatal(err)
		}
		txmq = append(txmq, r)
	}
	nats := []*result{
		{Config: "always", Shape: "sync-16", Throughput: 2800},
		{Config: "always", Shape: "sync-1", Throughput: 600, lats: summary{P50: 1450 * time.Microsecond}},
	}
	var b bytes.Buffer
	floorTable(&b, floor, nats, txmq)
	holds(t, b.String(),
		"| in-leader, 3 voter process(es), 16 writers | 5313 | 2.65 | 12.53 |",
		"| grpc-client, 3 voter process(es), 16 writers | 6054 | 2.27 | 12.44 |",
		"| writes/s at 16 producers, tx (2 per transaction) | 3000 | 6054 | 0.50 |",
		"| writes/s at 16 producers, send | 3027 | 6054 | 0.50 |",
		"| tx p50 at 1 producer against two floor writes, ms | 3.00 | 1.59 | 1.88 |",
		"(grpc-client), a transaction (two writes) reaches at most 3027/s at 16 writers: 1.08× NATS always's 2800 sync publishes/s.",
		"one write at 1 writer takes 0.80 ms at the p50 (NATS always, one sync publish: 1.45 ms).",
	)
	if strings.Contains(b.String(), "one-way") {
		t.Errorf("a one-way row without a tx-oneway run:\n%s", b.String())
	}

	b.Reset()
	floorTable(&b, nil, nats, txmq)
	if b.Len() != 0 {
		t.Errorf("no floor, yet a table:\n%s", b.String())
	}
}
