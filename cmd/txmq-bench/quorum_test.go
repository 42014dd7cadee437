package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/raftlog/wal"
)

// TestQuorumProbe times both orders of a write's log appends, as many
// rounds of each as asked, and leaves nothing in the data directory.
func TestQuorumProbe(t *testing.T) {
	dir := t.TempDir()
	inOrder, atOnce, err := measureQuorumAppends(dir, 20)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []summary{inOrder, atOnce} {
		if s.Count != 20 || s.P50 <= 0 || s.Max < s.P50 {
			t.Fatalf("want 20 rounds with times, got %+v", s)
		}
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) != 0 {
		t.Fatalf("the probe left %d files in the data directory", len(left))
	}
}

// A round stores the entry in all three logs, whichever the order, and a
// log that refuses it fails the round, the leader's or a follower's.
func TestQuorumAppend(t *testing.T) {
	open := func() [3]*wal.Log {
		var logs [3]*wal.Log
		root := t.TempDir()
		for i := range logs {
			l, err := wal.Open(filepath.Join(root, string(rune('a'+i))), wal.Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			logs[i] = l
		}
		return logs
	}
	entry := func(i uint64) *raft.Log {
		return &raft.Log{Index: i, Term: 1, Type: raft.LogCommand, Data: []byte("entry"), AppendedAt: time.Now()}
	}
	for _, atOnce := range []bool{false, true} {
		logs := open()
		for i := uint64(1); i <= 3; i++ {
			if _, err := quorumAppend(logs, entry(i), atOnce); err != nil {
				t.Fatalf("at once %v, entry %d: %v", atOnce, i, err)
			}
		}
		for n, l := range logs {
			if last, err := l.LastIndex(); err != nil || last != 3 {
				t.Fatalf("at once %v: log %d ends at %d (%v), want 3", atOnce, n, last, err)
			}
		}
		for bad := range logs {
			logs := open()
			if err := logs[bad].StoreLogs([]*raft.Log{entry(1)}); err != nil {
				t.Fatal(err)
			}
			if _, err := quorumAppend(logs, entry(1), atOnce); err == nil {
				t.Fatalf("at once %v: log %d refused entry 1 again, yet the round succeeded", atOnce, bad)
			}
		}
	}
}
