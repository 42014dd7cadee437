package main

import (
	"slices"
	"sync"
	"time"
)

// hist keeps every sample of one latency: runs are seconds long, so the
// samples fit in memory and the percentiles are exact.
type hist struct {
	mu sync.Mutex
	v  []time.Duration
}

func (h *hist) add(d time.Duration) {
	h.mu.Lock()
	h.v = append(h.v, d)
	h.mu.Unlock()
}

// summary is one latency's percentiles.
type summary struct {
	Count                    int
	Mean, P50, P95, P99, Max time.Duration
}

func (h *hist) summary() summary {
	h.mu.Lock()
	v := slices.Clone(h.v)
	h.mu.Unlock()
	if len(v) == 0 {
		return summary{}
	}
	slices.Sort(v)
	var total time.Duration
	for _, d := range v {
		total += d
	}
	at := func(p float64) time.Duration { return v[int(p*float64(len(v)-1))] }
	return summary{Count: len(v), Mean: total / time.Duration(len(v)), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: v[len(v)-1]}
}

// window says whether an operation that started at t is measured: after
// the warm-up, before the end.
type window struct{ from, to time.Time }

func (w window) in(t time.Time) bool { return !t.Before(w.from) && t.Before(w.to) }
