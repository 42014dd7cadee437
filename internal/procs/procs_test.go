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
