package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// floorRun is one run of raftlog's BenchmarkRaftFloor: hashicorp/raft
// alone as txmq configures it, with writers in the leader's process
// (shape in-leader) or in the benchmark's, each on a gRPC stream to the
// leader (grpc-client).
type floorRun struct {
	shape              string
	processes, writers int
	writesPerS         float64
	p50, p99           float64 // ms
}

// readFloor reads the runs out of `go test -bench RaftFloor` output.
// Lines look like
//
//	BenchmarkRaftFloor/grpc-client/processes=3/writers=16-2  1  2.913 p50-ms  12.22 p99-ms  4896 writes/s
func readFloor(r io.Reader) ([]floorRun, error) {
	var runs []floorRun
	s := bufio.NewScanner(r)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) == 0 || !strings.HasPrefix(f[0], "BenchmarkRaftFloor/") {
			continue
		}
		var fr floorRun
		name := f[0]
		if i := strings.LastIndexByte(name, '-'); i > strings.LastIndexByte(name, '/') {
			name = name[:i] // the GOMAXPROCS suffix
		}
		parts := strings.Split(name, "/")
		if len(parts) != 4 {
			return nil, fmt.Errorf("%q: not BenchmarkRaftFloor/SHAPE/processes=N/writers=N", f[0])
		}
		fr.shape = parts[1]
		if _, err := fmt.Sscanf(parts[2]+" "+parts[3], "processes=%d writers=%d", &fr.processes, &fr.writers); err != nil {
			return nil, fmt.Errorf("%q: %v", f[0], err)
		}
		units := map[string]*float64{"writes/s": &fr.writesPerS, "p50-ms": &fr.p50, "p99-ms": &fr.p99}
		for i := 2; i+1 < len(f); i += 2 {
			if p, ok := units[f[i+1]]; ok {
				v, err := strconv.ParseFloat(f[i], 64)
				if err != nil {
					return nil, fmt.Errorf("%q: %s: %v", f[0], f[i+1], err)
				}
				*p = v
				delete(units, f[i+1])
			}
		}
		if len(units) > 0 {
			return nil, fmt.Errorf("%q: %d of writes/s, p50-ms and p99-ms missing", f[0], len(units))
		}
		runs = append(runs, fr)
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if len(runs) == 0 {
		return nil, fmt.Errorf("no BenchmarkRaftFloor result in it")
	}
	return runs, nil
}

func readFloorFile(path string) ([]floorRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readFloor(f)
}

func findFloor(runs []floorRun, shape string, processes, writers int) (floorRun, bool) {
	for _, r := range runs {
		if r.shape == shape && r.processes == processes && r.writers == writers {
			return r, true
		}
	}
	return floorRun{}, false
}

// floorTable sets txmq's writes beside the floor's, and the most a
// transaction could reach at the floor beside NATS, from the floor's runs
// shaped as txmq-bench runs txmq: three voter processes, and the writers
// in another on gRPC streams (grpc-client).
func floorTable(w io.Writer, floor []floorRun, nats []*result, txmq []map[string]any) {
	if len(floor) == 0 {
		return
	}
	fmt.Fprintln(w, "\nThe Raft floor: hashicorp/raft alone as txmq configures it (the wal, loopback TCP, a state machine that does nothing); writers in the leader's process (in-leader) or in another, each on a gRPC stream to the leader (grpc-client); raftlog's BenchmarkRaftFloor, same run:")
	fmt.Fprintln(w, "\n| floor run | writes/s | p50 ms | p99 ms |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	for _, r := range floor {
		fmt.Fprintf(w, "| %s, %d voter process(es), %d writers | %.0f | %.2f | %.2f |\n", r.shape, r.processes, r.writers, r.writesPerS, r.p50, r.p99)
	}
	f16, ok16 := findFloor(floor, "grpc-client", 3, 16)
	f1, ok1 := findFloor(floor, "grpc-client", 3, 1)
	fmt.Fprintln(w, "\n| txmq against the floor (grpc-client, 3 voter processes) | txmq | floor | txmq / floor |")
	fmt.Fprintln(w, "|---|---:|---:|---:|")
	if tx, err := find(txmq, "tx", 16); err == nil && ok16 {
		v := 2 * num(tx["throughput_per_s"])
		fmt.Fprintf(w, "| writes/s at 16 producers, tx (2 per transaction) | %.0f | %.0f | %.2f |\n", v, f16.writesPerS, v/f16.writesPerS)
	}
	if s, err := find(txmq, "send", 16); err == nil && ok16 {
		v := num(s["throughput_per_s"])
		fmt.Fprintf(w, "| writes/s at 16 producers, send | %.0f | %.0f | %.2f |\n", v, f16.writesPerS, v/f16.writesPerS)
	}
	if tx, err := find(txmq, "tx", 1); err == nil && ok1 {
		v := num(tx["txn_p50_us"]) / 1e3
		fmt.Fprintf(w, "| tx p50 at 1 producer against two floor writes, ms | %.2f | %.2f | %.2f |\n", v, 2*f1.p50, v/(2*f1.p50))
	}
	if tx, err := find(txmq, "tx-oneway", 1); err == nil && ok1 {
		v := num(tx["txn_p50_us"]) / 1e3
		fmt.Fprintf(w, "| one-way tx p50 at 1 producer against one floor write, ms | %.2f | %.2f | %.2f |\n", v, f1.p50, v/f1.p50)
	}
	for _, n := range nats {
		if n.Config != "always" {
			continue
		}
		if n.Shape == "sync-16" && ok16 {
			fmt.Fprintf(w, "\nAt the floor (grpc-client), a transaction (two writes) reaches at most %.0f/s at 16 writers: %.2f× NATS always's %.0f sync publishes/s.\n",
				f16.writesPerS/2, f16.writesPerS/2/n.Throughput, n.Throughput)
		}
		if n.Shape == "sync-1" && ok1 {
			fmt.Fprintf(w, "\nAt the floor (grpc-client), one write at 1 writer takes %.2f ms at the p50 (NATS always, one sync publish: %.2f ms).\n",
				f1.p50, us(n.lats.P50)/1e3)
		}
	}
}
