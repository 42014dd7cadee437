package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// lazyFaults need the nodes' data on the lazy file system.
var lazyFaults = map[string]bool{"powercut": true, "disk-full": true, "slow-disk": true}

var errNoLazy = errors.New("the data directories are not on the lazy file system")

// runPowercut cuts the power of every node at once: kill -9 all of them,
// drop what their file systems had not synced, remount, and start them
// again after the hold.
func runPowercut(ctx context.Context, x *Chaos, _ string, hold time.Duration) error {
	if x.c.lazy == nil {
		return errNoLazy
	}
	return x.inject("powercut: every node at once", func() error {
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
		sleep(ctx, hold)
		for _, id := range x.c.IDs() {
			if err := x.c.Start(id, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

// runDiskFull makes one node's disk full (ENOSPC on writes) for the hold.
func runDiskFull(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	if x.c.lazy == nil {
		return errNoLazy
	}
	id, err := x.pick(ctx, variant)
	if err != nil {
		return err
	}
	return x.inject(fmt.Sprintf("disk-full %s %s", variant, id), func() error {
		x.c.lazy[id].SetFull(true)
		sleep(ctx, hold)
		x.c.lazy[id].SetFull(false)
		if !x.c.Running(id) {
			x.logf("%s stopped while its disk was full: %s", id, lastError(x.c.node(id).logPath))
		}
		return nil
	})
}

// runSlowDisk delays every fsync on one node by 10–200 ms for the hold.
func runSlowDisk(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	if x.c.lazy == nil {
		return errNoLazy
	}
	id, err := x.pick(ctx, variant)
	if err != nil {
		return err
	}
	return x.inject(fmt.Sprintf("slow-disk %s %s: fsync 10-200ms", variant, id), func() error {
		x.c.lazy[id].SetSyncDelay(func() time.Duration {
			return 10*time.Millisecond + rand.N(190*time.Millisecond)
		})
		sleep(ctx, hold)
		x.c.lazy[id].SetSyncDelay(nil)
		return nil
	})
}
