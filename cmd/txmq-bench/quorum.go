package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/hashicorp/raft"

	"github.com/txmq/txmq/raftlog/wal"
)

// A write is durable once the leader's log and one follower's hold it.
// hashicorp/raft appends to the leader's log before it replicates, so every
// write waits for two log appends one after the other, and where the nodes
// share one disk (as the bench's do) each append also waits for the other
// nodes' flushes. measureQuorumAppends times that on the data directory's
// disk with three of txmq's own log stores and nothing else running: the
// disk's floor under one write, in hashicorp/raft's order (the leader's
// append, then both followers' at once, until the first of them is done)
// and, alternating with it, in the order of a leader that appends while it
// replicates (all three at once, until the leader's and a follower's are
// done), which hashicorp/raft does not do.

// quorumRounds is how many writes of each order the probe times.
const quorumRounds = 1000

// quorumEntrySize is about the size of one log entry of a few merged
// commands with 256-byte bodies.
const quorumEntrySize = 600

func measureQuorumAppends(dir string, rounds int) (inOrder, atOnce summary, err error) {
	root, err := os.MkdirTemp(dir, "quorum-probe-")
	if err != nil {
		return summary{}, summary{}, fmt.Errorf("quorum probe: %w", err)
	}
	defer os.RemoveAll(root)
	var logs [3]*wal.Log
	for i := range logs {
		l, err := wal.Open(filepath.Join(root, strconv.Itoa(i)), wal.Options{})
		if err != nil {
			return summary{}, summary{}, fmt.Errorf("quorum probe: %w", err)
		}
		defer l.Close()
		logs[i] = l
	}
	data := make([]byte, quorumEntrySize)
	var seq, par hist
	for i := range 2 * rounds {
		e := &raft.Log{Index: uint64(i + 1), Term: 1, Type: raft.LogCommand, Data: data, AppendedAt: time.Now()}
		h := &seq
		if i%2 == 1 {
			h = &par
		}
		d, err := quorumAppend(logs, e, h == &par)
		if err != nil {
			return summary{}, summary{}, fmt.Errorf("quorum probe: %w", err)
		}
		h.add(d)
		// The time a write's answer and the next request take.
		time.Sleep(roundTripPause)
	}
	return seq.summary(), par.summary(), nil
}

// quorumAppend appends e to the three logs, the leader's (logs[0]) first
// or all at once, and returns when the leader's and the first follower's
// appends were done; it waits for the other follower's before it returns.
func quorumAppend(logs [3]*wal.Log, e *raft.Log, atOnce bool) (time.Duration, error) {
	t0 := time.Now()
	leader, followers := make(chan error, 1), make(chan error, 2)
	store := func(l *wal.Log, done chan<- error) { done <- l.StoreLogs([]*raft.Log{e}) }
	if atOnce {
		go store(logs[0], leader)
	} else {
		store(logs[0], leader)
	}
	go store(logs[1], followers)
	go store(logs[2], followers)
	err := errors.Join(<-leader, <-followers)
	d := time.Since(t0)
	return d, errors.Join(err, <-followers)
}
