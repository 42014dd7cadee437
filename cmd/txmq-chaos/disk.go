package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// corruptVariants: each file of a node (the wal's segments, its stable
// store, fsm.db, the newest snapshot) with bits flipped and cut short.
var corruptVariants = []string{
	"wal-header", "wal-tail", "wal-record", "wal-truncate", "stable",
	"fsm-truncate", "fsm-meta", "snapshot", "snapshot-truncate",
}

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
	if strings.HasPrefix(variant, "snapshot") {
		id = x.withSnapshot(ctx, id)
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
		if x.refused(ctx, id) {
			res.Refused = true
			res.Reason = lastError(x.c.node(id).logPath)
			x.logf("%s refused to start after %s: %s; wiping it and joining it again", id, res.Damage, res.Reason)
			err = x.rejoin(ctx, id)
		} else {
			x.logf("%s started after %s", id, res.Damage)
			err = x.waitMember(ctx, id)
		}
		x.mu.Lock()
		x.corrupted = append(x.corrupted, res)
		x.mu.Unlock()
		return err
	})
}

// refused waits until node id, just started, either exits (it refused
// to start: true) or answers its status (false), at most 60 s: opening a
// large fsm.db through the lazy file system can take seconds before the
// node checks its log.
func (x *Chaos) refused(ctx context.Context, id string) bool {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if x.c.Exited(id, 200*time.Millisecond) {
			return true
		}
		if _, err := x.c.Status(ctx, id, true); err == nil {
			return false
		}
	}
	return false
}

// withSnapshot is a follower that has a snapshot, if one has (a node
// that joined lately may have none yet), else id, asked to take one.
func (x *Chaos) withSnapshot(ctx context.Context, id string) string {
	leader, err := x.c.Leader(ctx)
	if err != nil {
		return id
	}
	for _, o := range x.c.IDs() {
		snaps, _ := filepath.Glob(filepath.Join(x.c.node(o).dir, "snapshots", "*", "state.bin"))
		if o != leader && len(snaps) > 0 {
			return o
		}
	}
	err = retry(ctx, 10*time.Second, func() error {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := x.c.Admin(id).TakeSnapshot(cctx, &txmqv1.TakeSnapshotRequest{})
		return err
	})
	if err != nil {
		x.logf("%s took no snapshot: %v", id, err)
	}
	return id
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
	case "wal-record", "wal-truncate":
		return damageRecord(dir, variant == "wal-truncate")
	case "stable":
		p := filepath.Join(dir, "raft-stable")
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		// In the values, past the header line.
		return flip(p, fi.Size()-12, 4)
	case "snapshot":
		return damageSnapshot(dir, func(p string, size int64) (string, error) { return flip(p, size/2, 64) })
	case "snapshot-truncate":
		return damageSnapshot(dir, func(p string, size int64) (string, error) {
			return fmt.Sprintf("truncated %s from %d to %d bytes", filepath.Base(filepath.Dir(p))+"/state.bin", size, size/2), os.Truncate(p, size/2)
		})
	}
	return "", fmt.Errorf("corrupt: no variant %q", variant)
}

// walRecords are the offsets of the records of wal segment p, walking its
// frames (length, crc, payload) from the header to the first zero frame.
func walRecords(p string) ([]int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var offs []int64
	for off := segmentHeaderSize; off+8 <= len(b); {
		n := int(binary.BigEndian.Uint32(b[off:]))
		if n == 0 && binary.BigEndian.Uint32(b[off+4:]) == 0 {
			break
		}
		offs = append(offs, int64(off))
		off += 8 + n
	}
	return offs, nil
}

// damageRecord damages a record of the newest wal segment that more than
// one append's worth of records (1,024) follow, so that it cannot be taken
// for a torn write: it flips bytes inside its payload, or (truncate) cuts
// the file in the middle of it.
func damageRecord(dir string, truncate bool) (string, error) {
	segs, _ := filepath.Glob(filepath.Join(dir, "raft-wal", "*.wal"))
	if len(segs) == 0 {
		return "", errors.New("corrupt: no wal segment")
	}
	slices.Sort(segs)
	p := segs[len(segs)-1]
	offs, err := walRecords(p)
	if err != nil {
		return "", err
	}
	const after = 1100
	if len(offs) <= after {
		return fmt.Sprintf("the newest wal segment holds %d records, too few to damage one that %d follow: nothing damaged", len(offs), after), nil
	}
	k := len(offs) - after - 1
	// 8 bytes of frame, then the payload: index, term, type, appendedAt.
	at := offs[k] + 8 + 17
	if truncate {
		return fmt.Sprintf("truncated %s inside record %d of %d (to %d bytes)", filepath.Base(p), k+1, len(offs), at), os.Truncate(p, at)
	}
	what, err := flip(p, at, 4)
	return fmt.Sprintf("%s (record %d of %d)", what, k+1, len(offs)), err
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

// damageSnapshot damages the node's newest snapshot (hurt is given its
// path and size) and deletes its fsm.db, so that the start has to rebuild
// the store from that snapshot (and the log), and so read it.
func damageSnapshot(dir string, hurt func(p string, size int64) (string, error)) (string, error) {
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
	what, err := hurt(p, size)
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

// countLines counts the lines of a node's log that contain s.
func countLines(logPath, s string) int {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
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
