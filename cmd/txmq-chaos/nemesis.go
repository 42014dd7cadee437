package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"
)

// Nemesis injects one kind of fault, holds it, and heals it. Each call of
// run takes the next of its variants, so a schedule that calls a nemesis
// as often as it has variants exercises them all.
type Nemesis struct {
	name     string
	variants []string
	run      func(ctx context.Context, x *Chaos, variant string, hold time.Duration) error
}

// nemeses are the implemented faults, by name.
var nemeses = map[string]Nemesis{
	"kill":       {"kill", []string{"leader", "random", "majority"}, runKill},
	"pause":      {"pause", []string{"leader", "follower"}, runPause},
	"partition":  {"partition", []string{"isolate-leader", "one-way", "delay", "halves"}, runPartition},
	"membership": {"membership", []string{"wipe-rejoin"}, runMembership},
	"powercut":   {"powercut", []string{"all"}, runPowercut},
	"disk-full":  {"disk-full", []string{"follower", "leader"}, runDiskFull},
	"slow-disk":  {"slow-disk", []string{"leader"}, runSlowDisk},
	"clock":      {"clock", []string{"80h", "-80h"}, runClock},
	"corrupt":    {"corrupt", corruptVariants, runCorrupt},
}

// allFaults is every fault of issue 13, in schedule order.
var allFaults = []string{"kill", "pause", "partition", "corrupt", "membership", "powercut", "disk-full", "slow-disk", "clock"}

// inject records a fault and its heal around f.
func (x *Chaos) inject(what string, f func() error) error {
	x.hist.Add(Event{Kind: evFault, Fault: what, Nemesis: x.current})
	x.logf("fault: %s", what)
	err := f()
	x.hist.Add(Event{Kind: evHeal, Fault: what})
	x.logf("healed: %s", what)
	return err
}

func (x *Chaos) pick(ctx context.Context, variant string) (string, error) {
	leader, err := x.c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return "", err
	}
	if variant == "leader" {
		return leader, nil
	}
	var others []string
	for _, id := range x.c.IDs() {
		if id != leader {
			others = append(others, id)
		}
	}
	if variant == "follower" {
		return others[rand.IntN(len(others))], nil
	}
	ids := x.c.IDs()
	return ids[rand.IntN(len(ids))], nil
}

func runKill(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	var victims []string
	if variant == "majority" {
		ids := slices.Clone(x.c.IDs())
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		victims = ids[:len(ids)/2+1]
	} else {
		id, err := x.pick(ctx, variant)
		if err != nil {
			return err
		}
		victims = []string{id}
	}
	return x.inject(fmt.Sprintf("kill -9 %s %v", variant, victims), func() error {
		for _, id := range victims {
			x.c.Kill(id)
		}
		sleep(ctx, hold)
		for _, id := range victims {
			if err := x.c.Start(id, nil); err != nil {
				return err
			}
		}
		return nil
	})
}

func runPause(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	id, err := x.pick(ctx, variant)
	if err != nil {
		return err
	}
	return x.inject(fmt.Sprintf("pause %s %s", variant, id), func() error {
		x.c.Pause(id)
		sleep(ctx, hold)
		x.c.Resume(id)
		return nil
	})
}

func runPartition(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	leader, err := x.c.WaitLeader(ctx, 30*time.Second)
	if err != nil {
		return err
	}
	n := x.c.net
	ids := x.c.IDs()
	var what string
	switch variant {
	case "isolate-leader":
		what = "isolate leader " + leader
	case "one-way":
		// The leader's messages still reach the others, their answers do
		// not reach it: followers keep hearing heartbeats.
		what = "drop every link into leader " + leader + " (one way)"
	case "delay":
		what = "delay every link 20ms + up to 80ms jitter"
	case "halves":
		ids = slices.Clone(ids)
		rand.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		what = fmt.Sprintf("split into %v | %v", ids[:len(ids)/2], ids[len(ids)/2:])
	}
	return x.inject("partition: "+what, func() error {
		for _, id := range ids {
			switch {
			case variant == "isolate-leader" && id != leader:
				n.Cut(leader, id)
			case variant == "one-way" && id != leader:
				n.Drop(id, leader)
			case variant == "halves" && slices.Index(ids, id) < len(ids)/2:
				for _, other := range ids[len(ids)/2:] {
					n.Cut(id, other)
				}
			case variant == "delay":
				for _, to := range ids {
					if to != id {
						n.Delay(id, to, 20*time.Millisecond, 80*time.Millisecond)
					}
				}
			}
		}
		sleep(ctx, hold)
		n.Heal()
		return nil
	})
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
