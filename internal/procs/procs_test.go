package procs

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/internal/txmqtest"
)

// A process that ends by itself is named by Ended, with its exit status
// and its log, which holds what it printed; the others run on until Stop
// stops them.
func TestEndedNamesTheProcessThatStopped(t *testing.T) {
	dir := t.TempDir()
	var g Group
	for i, script := range []string{"exec sleep 60", "echo cannot listen; exit 3", "exec sleep 60"} {
		if err := g.Start(fmt.Sprint("server n", i+1), exec.Command("sh", "-c", script), filepath.Join(dir, fmt.Sprint(i+1, ".log"))); err != nil {
			t.Fatal(err)
		}
	}
	var ended error
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if ended = g.Ended(); ended == nil {
			return errors.New("no process ended")
		}
		return nil
	})
	log := filepath.Join(dir, "2.log")
	if want := "server n2 ended by itself (exit status 3): its log is " + log; ended.Error() != want {
		t.Fatalf("Ended: %q, want %q", ended, want)
	}
	if out, err := os.ReadFile(log); err != nil || string(out) != "cannot listen\n" {
		t.Fatalf("n2's log %q (%v), want what it printed", out, err)
	}
	if err := g.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	for _, p := range g.procs {
		select {
		case <-p.done:
		default:
			t.Fatalf("%s still runs after Stop", p.name)
		}
	}
}

// Usage reads a running process's CPU time and peak RSS from /proc, and
// says it cannot once one has ended.
func TestUsage(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	var g Group
	if err := g.Start("sleeper", exec.Command("sleep", "60"), filepath.Join(t.TempDir(), "log")); err != nil {
		t.Fatal(err)
	}
	cpu, peak, ok := g.Usage()
	if !ok || cpu < 0 || peak == 0 {
		t.Fatalf("Usage of a running process: %v, %d bytes, %v", cpu, peak, ok)
	}
	if err := g.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := g.Usage(); ok {
		t.Fatal("Usage of an ended process says it could read it")
	}
}

// A process that cannot start, or whose log cannot be made, is an error
// that names it, and nothing is added to the group.
func TestStartFails(t *testing.T) {
	dir := t.TempDir()
	var g Group
	err := g.Start("server n1", exec.Command(filepath.Join(dir, "missing")), filepath.Join(dir, "n1.log"))
	if err == nil || !strings.Contains(err.Error(), "start server n1") {
		t.Fatalf("Start of a missing binary: %v", err)
	}
	err = g.Start("server n2", exec.Command("true"), filepath.Join(dir, "no", "such", "dir", "n2.log"))
	if err == nil || !strings.Contains(err.Error(), "start server n2") {
		t.Fatalf("Start with a log in a missing folder: %v", err)
	}
	if g.Len() != 0 {
		t.Fatalf("%d processes in the group, want none", g.Len())
	}
}

// /proc/stat's context switches and busy CPU time: everything but idle and
// iowait, in USER_HZ; a file without both lines, or with a count that is
// not a number, is not read.
func TestParseStat(t *testing.T) {
	stat := "cpu  100 5 50 1000 20 3 7 15 0 0\ncpu0 50 2 25 500 10 1 3 7 0 0\nintr 12345 0 0\nctxt 987654\nbtime 1796600000\n"
	m, ok := parseStat(stat)
	if !ok {
		t.Fatal("not read")
	}
	if want := (Machine{Switches: 987654, Busy: 180 * 10 * time.Millisecond}); m != want {
		t.Fatalf("got %+v, want %+v", m, want)
	}
	for _, bad := range []string{
		"cpu  100 5 50 1000 20 3 7 15 0 0\n",
		"ctxt 987654\n",
		"cpu  100 5 x 1000 20 3 7 15 0 0\nctxt 1\n",
		"cpu  100 5 50 1000 20 3 7 15 0 0\nctxt -1\n",
	} {
		if m, ok := parseStat(bad); ok {
			t.Errorf("%q read as %+v", bad, m)
		}
	}
	later := Machine{Switches: 987700, Busy: 2 * time.Second}
	if d := later.Sub(m); d != (Machine{Switches: 46, Busy: 200 * time.Millisecond}) {
		t.Fatalf("Sub: %+v", d)
	}
}

// On Linux the machine's counts are read, and they grow.
func TestReadMachine(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	m0, ok := ReadMachine()
	if !ok || m0.Switches == 0 {
		t.Fatalf("ReadMachine: %+v, %v", m0, ok)
	}
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		m, _ := ReadMachine()
		if d := m.Sub(m0); d.Switches == 0 || d.Busy == 0 {
			return fmt.Errorf("no switches or busy time counted since: %+v", d)
		}
		return nil
	})
}
