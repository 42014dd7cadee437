package main

import (
	"runtime"
	"testing"
	"time"

	"github.com/txmq/txmq/internal/procs"
)

// The machine's figures are per operation and per second of the window,
// and only where the bench measured the brokers too: a cluster given with
// --addr may run on another machine.
func TestMachineFigures(t *testing.T) {
	measured := usage{ok: true, wall: 2 * time.Second, machineOK: true,
		machine: procs.Machine{Switches: 5000, Busy: 3 * time.Second}}
	r := &result{Ops: 1000, usage: measured}
	busy, perOp, ok := r.machine()
	if !ok || busy != 1.5 || perOp != 5 {
		t.Fatalf("machine: %v cores, %v per op, %v; want 1.5, 5, true", busy, perOp, ok)
	}
	o := r.object()
	if o["machine_busy_cores"] != 1.5 || o["machine_switches_per_op"] != 5.0 {
		t.Fatalf("JSON: %v", o)
	}

	for name, r := range map[string]*result{
		"--addr (brokers not measured)": {Ops: 1000, usage: usage{wall: 2 * time.Second, machineOK: true, machine: measured.machine}},
		"no /proc/stat":                 {Ops: 1000, usage: usage{ok: true, wall: 2 * time.Second}},
		"no operations":                 {usage: measured},
	} {
		if _, _, ok := r.machine(); ok {
			t.Errorf("%s: machine figures given", name)
		}
		if _, ok := r.object()["machine_busy_cores"]; ok {
			t.Errorf("%s: machine_busy_cores in the JSON", name)
		}
	}
}

// A meter over a cluster given with --addr gives no machine figures (one
// over measured brokers gives them in every workload: BenchmarkWorkloads).
func TestMeterMachineOnlyWithTheBrokers(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc/stat")
	}
	m := newMeter(remote{"127.0.0.1:1"}, false)
	m.start()
	m.stop()
	r := &result{Ops: 1, usage: m.result()}
	if _, _, ok := r.machine(); ok {
		t.Fatal("machine figures for a cluster the bench does not measure")
	}
}
