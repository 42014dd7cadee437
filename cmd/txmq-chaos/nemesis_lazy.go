package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/txmq/txmq/cmd/txmq-chaos/lazyfs"
)

// lazyFaults need the nodes' data on the lazy file system.
var lazyFaults = map[string]bool{"powercut": true, "disk-full": true, "slow-disk": true}

var errNoLazy = errors.New("the data directories are not on the lazy file system")

// runPowercut cuts the power of every node at once: kill -9 all of them,
// drop what their file systems had not synced, remount, and start them
// again after the hold, with a new boot ID (the machines rebooted), so
// that each rebuilds the fsm.db a power cut may have torn.
func runPowercut(ctx context.Context, x *Chaos, _ string, hold time.Duration) error {
	if x.c.lazy == nil {
		return errNoLazy
	}
	const rebuilt = "left unsynced by an earlier boot"
	before := map[string]int{}
	for _, id := range x.c.IDs() {
		before[id] = countLines(x.c.node(id).logPath, rebuilt)
	}
	err := x.inject("powercut: every node at once", func() error {
		var wg sync.WaitGroup
		for _, id := range x.c.IDs() {
			wg.Go(func() { x.c.Kill(id) })
		}
		wg.Wait()
		for _, id := range x.c.IDs() {
			l := x.c.lazy[id]
			files, bytes, err := l.Cut()
			if err != nil {
				return err
			}
			if err := l.Unmount(); err != nil {
				return fmt.Errorf("unmount %s: %w", id, err)
			}
			if err := l.Remount(); err != nil {
				return fmt.Errorf("remount %s: %w", id, err)
			}
			x.logf("%s: the cut undid unsynced writes in %d files (%d bytes put back)", id, files, bytes)
		}
		if err := x.c.NewBoot(); err != nil {
			return err
		}
		sleep(ctx, hold)
		for _, id := range x.c.IDs() {
			if err := x.c.Start(id, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	// A leader is elected once the nodes have opened their stores.
	if _, err := x.c.WaitLeader(ctx, 30*time.Second); err != nil {
		return err
	}
	var did []string
	for _, id := range x.c.IDs() {
		if countLines(x.c.node(id).logPath, rebuilt) > before[id] {
			did = append(did, id)
		}
	}
	x.logf("with a new boot ID, rebuilt fsm.db from the snapshot and the log: %v of %v", did, x.c.IDs())
	return nil
}

// runDiskFull makes one node's disk full (ENOSPC on writes) for the hold,
// and shows what the node answers meanwhile and that it recovers in place.
func runDiskFull(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	return x.onDisk(ctx, variant, hold, "disk-full", func(l *lazyfs.FS, on bool) { l.SetFull(on) }, x.watchDiskFull)
}

// runSlowDisk delays every fsync on one node by 10–200 ms for the hold.
func runSlowDisk(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	return x.onDisk(ctx, variant, hold, "slow-disk (fsync 10-200ms)", func(l *lazyfs.FS, on bool) {
		if !on {
			l.SetSyncDelay(nil)
			return
		}
		l.SetSyncDelay(func() time.Duration { return 10*time.Millisecond + rand.N(190*time.Millisecond) })
	}, nil)
}

// onDisk turns a disk fault on for the hold on the node variant picks
// (watch, if set, runs for the hold), then off, and says if the node
// stopped meanwhile.
func (x *Chaos) onDisk(ctx context.Context, variant string, hold time.Duration, what string, set func(l *lazyfs.FS, on bool), watch func(ctx context.Context, id string, hold time.Duration)) error {
	if x.c.lazy == nil {
		return errNoLazy
	}
	id, err := x.pick(ctx, variant)
	if err != nil {
		return err
	}
	return x.inject(fmt.Sprintf("%s %s %s", what, variant, id), func() error {
		set(x.c.lazy[id], true)
		if watch != nil {
			watch(ctx, id, hold)
		} else {
			sleep(ctx, hold)
		}
		set(x.c.lazy[id], false)
		if !x.c.Running(id) {
			x.logf("%s stopped during %s: %s", id, what, lastError(x.c.node(id).logPath))
		}
		return nil
	})
}

// watchDiskFull asks the node with the full disk for its status during
// the hold and logs the first refusal that names its disk (the clear
// status a client gets), and how many of the workload's calls failed
// naming it. The node is expected to stay up.
func (x *Chaos) watchDiskFull(ctx context.Context, id string, hold time.Duration) {
	start := time.Now()
	said := ""
	for time.Since(start) < hold && ctx.Err() == nil {
		_, err := x.c.Status(ctx, id, true)
		if st := status.Convert(err); err != nil && said == "" && strings.Contains(st.Message(), "disk") {
			said = fmt.Sprintf("%s: %s", st.Code(), st.Message())
		}
		sleep(ctx, 100*time.Millisecond)
	}
	if said == "" {
		said = "nothing naming its disk"
	}
	seen := 0
	for _, e := range x.hist.Events() {
		if e.T.After(start) && strings.Contains(e.Err, "disk") {
			seen++
		}
	}
	x.logf("%s answered during the full disk: %s; workload calls that failed naming the disk: %d", id, said, seen)
}
