package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClusterChaosShort runs a short chaos run on three real broker
// processes: one variant each of kill, pause, partition, corrupt and
// membership, held two seconds each. Nothing may be lost, delivered as a
// ghost or left pending, and the stores must converge.
func TestClusterChaosShort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts broker processes for about a minute")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "broker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/txmq/txmq/cmd/broker").CombinedOutput()
	require.NoError(t, err, "%s", out)
	var log bytes.Buffer
	cfg := Config{
		BrokerBin: bin, Dir: dir, Nodes: 3, Producers: 2,
		Faults: []string{"kill", "pause", "partition", "corrupt", "membership", "powercut"},
		Hold:   2 * time.Second, Interval: 2 * time.Second, Drain: time.Minute,
		History: filepath.Join(dir, "history.jsonl"), Out: &log,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	printReport(&log, cfg, rep)
	t.Log(log.String())
	require.NoError(t, err)
	require.Greater(t, rep.Committed, 0, "the workload committed nothing")
	require.Greater(t, rep.Deliveries, 0, "nothing was delivered")
	require.Empty(t, rep.Lost, "lost")
	require.Empty(t, rep.Ghosts, "ghosts")
	require.Zero(t, rep.PendingLeft, "pending left")
	require.True(t, rep.Converged, rep.ConvergeDetail)
	require.Len(t, rep.Outages, 5, "every fault ran")
	require.Len(t, rep.Corrupted, 1)
	require.Len(t, rep.Skipped, 1, "powercut is named as skipped")
	require.FileExists(t, cfg.History)
}
