package main

import (
	"fmt"
	"os"
	"time"
)

// measureFsync writes and fsyncs one 4 KiB page n times in dir, the way a
// bbolt commit ends, and returns the latencies: the floor under every
// acknowledged write of the brokers that run in dir.
func measureFsync(dir string, n int) (summary, error) {
	f, err := os.CreateTemp(dir, "fsync-probe-")
	if err != nil {
		return summary{}, fmt.Errorf("fsync probe: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	page := make([]byte, 4096)
	var h hist
	for i := range n {
		page[0] = byte(i)
		t0 := time.Now()
		if _, err := f.WriteAt(page, int64(i%16)*4096); err != nil {
			return summary{}, fmt.Errorf("fsync probe: %w", err)
		}
		if err := f.Sync(); err != nil {
			return summary{}, fmt.Errorf("fsync probe: %w", err)
		}
		h.add(time.Since(t0))
	}
	return h.summary(), nil
}
