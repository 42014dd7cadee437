package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"
)

// watchFlags are --watch and --interval of a command that can print
// itself again and again (stats, group describe, half list).
type watchFlags struct {
	on       *bool
	interval *time.Duration
}

func addWatchFlags(fs *flag.FlagSet, interval time.Duration, intervalUsage string) watchFlags {
	return watchFlags{
		on:       fs.Bool("watch", false, "print a new frame every --interval until interrupted"),
		interval: fs.Duration("interval", interval, intervalUsage),
	}
}

// check refuses an interval that is not positive.
func (w watchFlags) check(c *cli, fs *flag.FlagSet) error {
	if *w.interval <= 0 {
		return c.usageError(fs, "--interval must be positive")
	}
	return nil
}

// repeat prints frame once, or with --watch every --interval until ctx
// ends, which is how a watch stops: then it returns nil. On a terminal
// each frame replaces the previous one; elsewhere a blank line separates
// table frames, and JSON frames simply follow each other.
func (c *cli) repeat(ctx context.Context, w watchFlags, frame func() error) error {
	clear := *w.on && !c.jsonOutput() && isTerminal(c.stdout)
	for n := 0; ; n++ {
		if n > 0 && !sleep(ctx, *w.interval) {
			return nil
		}
		switch {
		case clear:
			if _, err := io.WriteString(c.stdout, clearScreen); err != nil {
				return err
			}
		case n > 0 && !c.jsonOutput():
			fmt.Fprintln(c.stdout)
		}
		err := frame()
		if *w.on && ctx.Err() != nil {
			return nil
		}
		if err != nil || !*w.on {
			return err
		}
	}
}

// sleep waits d, or until ctx ends: then it reports false.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
