package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// combinedFaults run by default after the single faults: two faults at
// once (--faults kill+partition).
var combinedFaults = []string{"kill+partition", "pause+slow-disk"}

// nemesisFor is the nemesis of one --faults item: a fault's name, or
// names joined by "+", which are applied together (each in its own
// goroutine, at once, held as long) and healed together. The i-th variant
// of a combination is the i-th variant of each of its faults, so it has
// as many as the fault with the fewest.
func nemesisFor(spec string) (Nemesis, error) {
	names := strings.Split(spec, "+")
	if len(names) == 1 {
		n, ok := nemeses[spec]
		if !ok {
			return Nemesis{}, fmt.Errorf("no fault %q (have %s)", spec, strings.Join(allFaults, ", "))
		}
		return n, nil
	}
	var parts []Nemesis
	for i, name := range names {
		n, ok := nemeses[name]
		if !ok {
			return Nemesis{}, fmt.Errorf("%s: no fault %q (have %s)", spec, name, strings.Join(allFaults, ", "))
		}
		if strings.Contains(strings.Join(names[:i], "+")+"+", name+"+") {
			return Nemesis{}, fmt.Errorf("%s: %s twice", spec, name)
		}
		parts = append(parts, n)
	}
	count := len(parts[0].variants)
	for _, p := range parts {
		count = min(count, len(p.variants))
	}
	variants := make([]string, count)
	for i := range variants {
		var vs []string
		for _, p := range parts {
			vs = append(vs, p.variants[i])
		}
		variants[i] = strings.Join(vs, "+")
	}
	run := func(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
		vs := strings.Split(variant, "+")
		errs := make([]error, len(parts))
		var wg sync.WaitGroup
		for i, p := range parts {
			wg.Go(func() {
				if err := p.run(ctx, x, vs[i], hold); err != nil {
					errs[i] = fmt.Errorf("%s %s: %w", p.name, vs[i], err)
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	return Nemesis{name: spec, variants: variants, run: run}, nil
}

// needsLazy says whether a --faults item needs the lazy file system.
func needsLazy(spec string) bool {
	for _, name := range strings.Split(spec, "+") {
		if lazyFaults[name] {
			return true
		}
	}
	return false
}
