package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// A server that stops by itself is named by ended, with its log; the
// others still run and close stops them. The "servers" here are shell
// commands: the second exits at once, the others wait.
func TestEndedNamesAServerThatStopped(t *testing.T) {
	dir := t.TempDir()
	var c natsCluster
	for i, script := range []string{"exec sleep 60", "echo cannot listen; exit 3", "exec sleep 60"} {
		if err := c.start(exec.Command("sh", "-c", script), filepath.Join(dir, fmt.Sprint(i+1)+".log")); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	var ended error
	for ended == nil && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		ended = c.ended()
	}
	if ended == nil {
		t.Fatal("no server ended within 10 s")
	}
	want := "nats server n2 ended by itself (exit status 3): its log is " + filepath.Join(dir, "2.log")
	if msg := ended.Error(); msg != want {
		t.Fatalf("ended: %q, want %q", msg, want)
	}
	if err := c.close(); err != nil {
		t.Fatalf("close: %v", err)
	}
}
