package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/internal/txmqtest"
)

// A broker process that stops by itself is named by ended, with its log,
// so that a run does not report a smaller cluster's figures; the others
// still run and close stops them. The "broker" here is a script: n2's
// exits at once, as one that cannot listen would, the others wait.
func TestEndedNamesABrokerThatStopped(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "broker")
	script := "#!/bin/sh\ncase \"$*\" in *\"--node-id n2 \"*) echo cannot listen >&2; exit 3;; esac\nexec sleep 60\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := clusterSpec{nodes: 3, brokerBin: bin, dir: dir, out: io.Discard}
	nodes, peers, err := planNodes(spec)
	if err != nil {
		t.Fatal(err)
	}
	c, err := startProcesses(spec, nodes, peers)
	if err != nil {
		t.Fatal(err)
	}
	var ended error
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if ended = c.ended(); ended == nil {
			return errors.New("no broker ended")
		}
		return nil
	})
	logPath := filepath.Join(nodes[1].dir, "broker.log")
	if want := "broker n2 ended by itself (exit status 3): its log is " + logPath; ended.Error() != want {
		t.Fatalf("ended: %q, want %q", ended, want)
	}
	if log, err := os.ReadFile(logPath); err != nil || !strings.Contains(string(log), "cannot listen") {
		t.Fatalf("n2's log %q (%v), want what it printed", log, err)
	}
	if err := c.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}
