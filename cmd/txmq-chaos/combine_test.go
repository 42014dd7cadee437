package main

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A combination has the variants of its faults side by side and runs
// them at once, each with its own variant.
func TestCombinedNemesis(t *testing.T) {
	n, err := nemesisFor("kill+partition")
	require.NoError(t, err)
	require.Equal(t, []string{"leader+isolate-leader", "random+one-way", "majority+delay"}, n.variants, "as many as kill has")

	for _, bad := range []string{"kill+nope", "kill+kill", "nope"} {
		_, err := nemesisFor(bad)
		require.Error(t, err, bad)
	}
	require.True(t, needsLazy("pause+slow-disk"))
	require.False(t, needsLazy("kill+partition"))

	// Both faults are on at the same time.
	var mu sync.Mutex
	var on, most int
	fake := func(ctx context.Context, x *Chaos, v string, hold time.Duration) error {
		mu.Lock()
		on++
		most = max(most, on)
		mu.Unlock()
		time.Sleep(hold)
		mu.Lock()
		on--
		mu.Unlock()
		return nil
	}
	saved := nemeses
	t.Cleanup(func() { nemeses = saved })
	nemeses = map[string]Nemesis{"a": {"a", []string{"1", "2"}, fake}, "b": {"b", []string{"x"}, fake}}
	n, err = nemesisFor("a+b")
	require.NoError(t, err)
	require.Equal(t, []string{"1+x"}, n.variants)
	require.NoError(t, n.run(context.Background(), nil, n.variants[0], 50*time.Millisecond))
	require.Equal(t, 2, most, "the two faults were on together")
}
