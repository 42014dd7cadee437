package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func buildBroker(t *testing.T, dir string) string {
	bin := filepath.Join(dir, "broker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/txmq/txmq/cmd/broker").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

func runChaos(t *testing.T, cfg Config) Report {
	// Before the temporary directory's removal (cleanups run last
	// first): a failed run leaves what its nodes said in the test's
	// output.
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(nodeLogs(cfg.Dir))
		}
	})
	var log bytes.Buffer
	cfg.Out = &log
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	printReport(&log, cfg, rep)
	t.Log(log.String())
	require.NoError(t, err)
	return rep
}

// A failed run shows, of each node's log, the last nodeLogTail lines and
// before them up to nodeLogNotable lines that tell of a start or an exit,
// a panic or an error (the last ones).
const (
	nodeLogTail    = 60
	nodeLogNotable = 200
)

// nodeLogs is what each node's log under dir says that matters to a
// failed run.
func nodeLogs(dir string) string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, path := range logs {
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", path, err)
			continue
		}
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		tail := max(0, len(lines)-nodeLogTail)
		var shown []int
		for i, l := range lines[:tail] {
			if notable(l) {
				shown = append(shown, i)
			}
		}
		shown = shown[max(0, len(shown)-nodeLogNotable):]
		for i := tail; i < len(lines); i++ {
			shown = append(shown, i)
		}
		fmt.Fprintf(&b, "==== %s, %d lines; up to %d of its starts, exits, panics and errors, then its last %d:\n",
			filepath.Base(path), len(lines), nodeLogNotable, nodeLogTail)
		for _, i := range shown {
			fmt.Fprintf(&b, "%7d  %s\n", i+1, lines[i])
		}
	}
	return b.String()
}

func notable(line string) bool {
	for _, s := range []string{"==== chaos", "panic", "fatal", "level=ERROR", "goroutine "} {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// TestClusterChaosShort runs a short chaos run on three real broker
// processes: one variant each of kill, pause, partition, corrupt,
// membership, powercut, disk-full, slow-disk (the last three on the lazy
// file system, skipped without FUSE) and clock, and kill and partition at
// once, held two seconds each. Nothing
// may be lost, delivered as a ghost or left pending, and the stores must
// converge.
func TestClusterChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts broker processes for about a minute")
	}
	dir := t.TempDir()
	cfg := Config{
		BrokerBin: buildBroker(t, dir), Dir: dir, Nodes: 3, Producers: 2,
		Faults: []string{"kill", "pause", "partition", "corrupt", "membership", "powercut", "disk-full", "slow-disk", "clock", "kill+partition"},
		Hold:   2 * time.Second, Interval: 2 * time.Second, Drain: time.Minute,
		History: filepath.Join(dir, "history.jsonl"),
	}
	rep := runChaos(t, cfg)
	require.Greater(t, rep.Committed, 0, "the workload committed nothing")
	require.Greater(t, rep.Deliveries, 0, "nothing was delivered")
	require.Empty(t, rep.Lost, "lost")
	require.Empty(t, rep.Ghosts, "ghosts")
	require.Zero(t, rep.PendingLeft, "pending left")
	require.Empty(t, rep.NonLinearizable, "not linearizable")
	require.True(t, rep.Converged, rep.ConvergeDetail)
	require.Len(t, rep.Corrupted, 1)
	faults := 0
	for _, f := range cfg.Faults {
		faults += len(strings.Split(f, "+"))
	}
	require.Equal(t, faults, len(rep.Outages)+len(rep.Skipped), "every fault ran (each of a combination) or is named as skipped")
	require.FileExists(t, cfg.History)
}

// TestClusterPowercutBites: with the wal's fsync lying (acknowledged
// writes not durable), a power cut of every node loses acknowledged
// writes, and the checker must say so.
func TestClusterPowercutBites(t *testing.T) {
	if testing.Short() {
		t.Skip("starts broker processes for about a minute")
	}
	dir := t.TempDir()
	cfg := Config{
		BrokerBin: buildBroker(t, dir), Dir: dir, Nodes: 3, Producers: 2,
		Faults: []string{"powercut"}, BrokenFsync: true,
		// The first wal segments are older than the lie's 3 s when the
		// power goes: the nodes restart, having lost only recent writes.
		Hold: 2 * time.Second, Interval: 5 * time.Second, Drain: 15 * time.Second,
	}
	rep := runChaos(t, cfg)
	if len(rep.Skipped) > 0 {
		t.Skip(rep.Skipped[0])
	}
	require.NotEmpty(t, rep.Lost, "a power cut with a lying fsync lost nothing: the fault does not bite")
	require.True(t, rep.Failed())
}

// TestNodeLogs: a failed run shows each node's starts, exits, panics and
// errors, however far back, and its last lines, numbered as in the file.
func TestNodeLogs(t *testing.T) {
	dir := t.TempDir()
	var n1 strings.Builder
	n1.WriteString("==== chaos: start n1\n")
	n1.WriteString("level=ERROR msg=\"store failed\"\n")
	for i := range 100 {
		fmt.Fprintf(&n1, "level=INFO msg=acked n=%d\n", i)
	}
	n1.WriteString("panic: boom\n")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "n1.log"), []byte(n1.String()), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "n2.log"), []byte("==== chaos: n2 exited: signal: killed\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "history.jsonl"), []byte("{}\n"), 0o644))

	out := nodeLogs(dir)
	require.Contains(t, out, "==== n1.log, 103 lines")
	require.Contains(t, out, "      1  ==== chaos: start n1\n      2  level=ERROR")
	require.NotContains(t, out, "n=40\n", "an ordinary line before the tail")
	require.Contains(t, out, "     44  level=INFO msg=acked n=41\n")
	require.Contains(t, out, "    103  panic: boom\n")
	require.Contains(t, out, "==== n2.log, 1 lines")
	require.Contains(t, out, "      1  ==== chaos: n2 exited: signal: killed\n")
	require.NotContains(t, out, "history")
}
