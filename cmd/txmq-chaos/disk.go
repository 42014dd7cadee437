package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// CorruptResult is what one corruption did to the node.
type CorruptResult struct {
	Variant, Node, Damage string
	// Refused: the node would not start (Reason: its last error line),
	// and was wiped and rejoined. Otherwise it started and caught up.
	Refused bool
	Reason  string
}

func runMembership(ctx context.Context, x *Chaos, _ string, hold time.Duration) error {
	id, err := x.pick(ctx, "follower")
	if err != nil {
		return err
	}
	return x.inject("membership: remove "+id+", wipe it, join it again", func() error {
		x.c.Stop(id)
		sleep(ctx, hold/2)
		return x.rejoin(ctx, id)
	})
}

// rejoin removes stopped node id from the cluster, empties its data
// directory, and starts it with --join through the other nodes: a wiped
// node must not come back as the member it was (it forgot its votes and
// what it acknowledged), so it joins as a new one (docs/operations.md ›
// Recovering a node).
func (x *Chaos) rejoin(ctx context.Context, id string) error {
	var others []string
	for _, o := range x.c.IDs() {
		if o != id {
			others = append(others, x.c.node(o).grpc)
		}
	}
	if err := retry(ctx, 30*time.Second, func() error {
		leader, err := x.c.Leader(ctx)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err = x.c.Admin(leader).RemoveNode(cctx, &txmqv1.RemoveNodeRequest{NodeId: id})
		return err
	}); err != nil {
		return fmt.Errorf("remove %s: %w", id, err)
	}
	if err := x.c.Wipe(id); err != nil {
		return err
	}
	if err := x.c.Start(id, others); err != nil {
		return err
	}
	return x.waitMember(ctx, id)
}

// waitMember waits until the leader counts id as a reachable voter that is
// less than 1,000 entries behind.
func (x *Chaos) waitMember(ctx context.Context, id string) error {
	return retry(ctx, 60*time.Second, func() error {
		leader, err := x.c.Leader(ctx)
		if err != nil {
			return err
		}
		st, err := x.c.Status(ctx, leader, false)
		if err != nil {
			return err
		}
		for _, m := range st.GetNodes() {
			if m.GetId() == id && m.GetSuffrage() == "VOTER" && m.GetReachable() && m.GetLag() < 1000 {
				return nil
			}
		}
		return fmt.Errorf("%s is not a caught-up voter yet", id)
	})
}

func retry(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleep(ctx, 300*time.Millisecond)
	}
}

func runCorrupt(ctx context.Context, x *Chaos, variant string, _ time.Duration) error {
	id, err := x.pick(ctx, "follower")
	if err != nil {
		return err
	}
	return x.inject("corrupt "+variant+" on "+id, func() error {
		x.c.Stop(id)
		res := CorruptResult{Variant: variant, Node: id}
		res.Damage, err = damage(x.c.node(id).dir, variant)
		if err != nil {
			return err
		}
		if err := x.c.Start(id, nil); err != nil {
			return err
		}
		if x.c.Exited(id, 10*time.Second) {
			res.Refused = true
			res.Reason = lastError(x.c.node(id).logPath)
			x.logf("%s refused to start after %s: %s; wiping it and joining it again", id, res.Damage, res.Reason)
			err = x.rejoin(ctx, id)
		} else {
			x.logf("%s started after %s", id, res.Damage)
			err = x.waitMember(ctx, id)
		}
		x.corrupted = append(x.corrupted, res)
		return err
	})
}

// damage damages one file of a stopped node's data directory.
func damage(dir, variant string) (string, error) {
	switch variant {
	case "wal-header":
		segs, _ := filepath.Glob(filepath.Join(dir, "raft-wal", "*.wal"))
		if len(segs) == 0 {
			return "", errors.New("corrupt: no wal segment")
		}
		slices.Sort(segs)
		return flip(segs[0], 4, 8)
	case "fsm-truncate":
		p := filepath.Join(dir, "fsm.db")
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		// 32 KiB: the meta pages and a few more; the store's data is past it.
		const keep = 32 << 10
		return fmt.Sprintf("truncated fsm.db from %d to %d bytes", fi.Size(), keep), os.Truncate(p, keep)
	case "fsm-meta":
		p := filepath.Join(dir, "fsm.db")
		if _, err := flip(p, 16, 32); err != nil {
			return "", err
		}
		return flip(p, int64(os.Getpagesize())+16, 32)
	case "wal-tail":
		return flipTail(dir)
	case "snapshot":
		return damageSnapshot(dir)
	}
	return "", fmt.Errorf("corrupt: no variant %q", variant)
}

// flipTail inverts the last bytes written to the newest wal segment (its
// reserved space after them is zeros): the last record is then what a
// torn write leaves, and must be dropped at start and sent again by the
// leader.
func flipTail(dir string) (string, error) {
	segs, _ := filepath.Glob(filepath.Join(dir, "raft-wal", "*.wal"))
	if len(segs) == 0 {
		return "", errors.New("corrupt: no wal segment")
	}
	slices.Sort(segs)
	p := segs[len(segs)-1]
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	if end < segmentHeaderSize+8 {
		return "the newest wal segment holds no record: nothing damaged", nil
	}
	return flip(p, int64(end-8), 8)
}

// segmentHeaderSize is the wal's segment header (raftlog/wal).
const segmentHeaderSize = 16

// damageSnapshot flips bytes in the middle of the node's newest snapshot
// and deletes its fsm.db, so that the start has to rebuild the store from
// that snapshot (and the log), and so read it.
func damageSnapshot(dir string) (string, error) {
	snaps, _ := filepath.Glob(filepath.Join(dir, "snapshots", "*", "state.bin"))
	if len(snaps) == 0 {
		return "no snapshot on the node yet: nothing damaged", nil
	}
	// The newest by time: names (term-index-time) do not sort as numbers.
	var p string
	var newest time.Time
	var size int64
	for _, sp := range snaps {
		fi, err := os.Stat(sp)
		if err != nil {
			return "", err
		}
		if fi.ModTime().After(newest) {
			p, newest, size = sp, fi.ModTime(), fi.Size()
		}
	}
	what, err := flip(p, size/2, 64)
	if err != nil {
		return "", err
	}
	return what + ", and deleted fsm.db", os.Remove(filepath.Join(dir, "fsm.db"))
}

// flip inverts n bytes of file p from offset off.
func flip(p string, off int64, n int) (string, error) {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b := make([]byte, n)
	k, err := f.ReadAt(b, off)
	if k == 0 {
		return "", fmt.Errorf("corrupt: read %s at %d: %w", p, off, err)
	}
	for i := range b[:k] {
		b[i] ^= 0xff
	}
	if _, err := f.WriteAt(b[:k], off); err != nil {
		return "", err
	}
	return fmt.Sprintf("flipped %d bytes of %s at offset %d", k, filepath.Base(filepath.Dir(p))+"/"+filepath.Base(p), off), f.Sync()
}

// lastError is the last line of a node's log that says why it stopped.
func lastError(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var last string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(l, "broker:") || strings.Contains(l, "level=ERROR") || strings.Contains(l, "panic") {
			last = l
		}
	}
	return last
}
