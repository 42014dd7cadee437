package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/txmq/txmq/internal/procs"
)

// result is one workload run.
type result struct {
	Workload  string
	Cluster   string
	Nodes     int
	Producers int
	// OneProducer: the producers were goroutines on one Producer
	// (--one-producer).
	OneProducer bool
	Consumers   int
	Size        int
	Measured    time.Duration
	Ops         int64
	// Writes are the producers' write calls among Ops: two per
	// transaction (SendHalf, Commit), one per Send or resolution.
	Writes     int64
	Errors     int64
	Throughput float64
	lats       []namedLat
	extras     []extra
	usage      usage
	stages     *breakdown // --breakdown
	Notes      []string
}

type namedLat struct {
	key, what string
	s         summary
}

type extra struct {
	key, what string
	v         float64
}

func (r *result) lat(key, what string, h *hist) {
	r.lats = append(r.lats, namedLat{key, what, h.summary()})
}

func (r *result) extra(key, what string, v float64) {
	r.extras = append(r.extras, extra{key, what, v})
}

func (r *result) latency(key string) (summary, bool) {
	for _, l := range r.lats {
		if l.key == key {
			return l.s, true
		}
	}
	return summary{}, false
}

// usage is what the brokers used during the measured window.
type usage struct {
	ok       bool
	cpu      time.Duration
	wall     time.Duration
	peakRSS  uint64
	heapOK   bool
	peakHeap uint64
	// machine is what the whole machine counted in the window (the
	// brokers, the bench's clients, the kernel), where /proc/stat tells.
	machine   procs.Machine
	machineOK bool
}

// meter measures the brokers' CPU time over a window, their peak RSS, and
// samples their Go heap every 2 s (each sample scrapes /metrics, which
// costs the brokers a little, so not more often). With --breakdown it
// scrapes every node's /metrics just before the window and just after,
// outside the CPU measurement.
type meter struct {
	c         cluster
	scrape    bool
	startOnce sync.Once
	stopOnce  sync.Once
	stopped   chan struct{}
	quit      chan struct{}
	sampled   chan struct{}

	cpu0     time.Duration
	machine0 procs.Machine
	t0       time.Time
	u        usage

	before, after []scrape
	scrapeErr     error
}

func newMeter(c cluster, scrape bool) *meter {
	return &meter{c: c, scrape: scrape, stopped: make(chan struct{}), quit: make(chan struct{}), sampled: make(chan struct{})}
}

func (m *meter) start() {
	m.startOnce.Do(func() {
		if m.scrape {
			m.before, m.scrapeErr = scrapeAll(m.c.metricsAddrs())
		}
		m.t0 = time.Now()
		m.cpu0, _, m.u.ok = m.c.usage()
		m.machine0, m.u.machineOK = procs.ReadMachine()
		go func() {
			defer close(m.sampled)
			t := time.NewTicker(2 * time.Second)
			defer t.Stop()
			for {
				if h, ok := m.c.heapInUse(); ok {
					m.u.heapOK = true
					m.u.peakHeap = max(m.u.peakHeap, h)
				}
				select {
				case <-m.quit:
					return
				case <-t.C:
				}
			}
		}()
	})
}

func (m *meter) stop() {
	m.stopOnce.Do(func() {
		m.start()
		close(m.quit)
		<-m.sampled
		m.u.wall = time.Since(m.t0)
		cpu, rss, ok := m.c.usage()
		m.u.ok = m.u.ok && ok
		m.u.cpu, m.u.peakRSS = cpu-m.cpu0, rss
		machine, ok := procs.ReadMachine()
		m.u.machineOK = m.u.machineOK && ok
		m.u.machine = machine.Sub(m.machine0)
		if m.scrape && m.scrapeErr == nil {
			m.after, m.scrapeErr = scrapeAll(m.c.metricsAddrs())
		}
		close(m.stopped)
	})
}

// result waits for the window to be closed and returns what was measured.
func (m *meter) result() usage {
	select {
	case <-m.stopped:
	case <-time.After(5 * time.Second):
		m.stop()
	}
	return m.u
}

// stages is the breakdown of the window, once result returned; shared
// says the nodes run in one process.
func (m *meter) stages(shared bool) (*breakdown, error) {
	if m.scrapeErr != nil {
		return nil, m.scrapeErr
	}
	return newBreakdown(m.before, m.after, shared), nil
}

// machine is how many of the machine's cores were busy in the window, and
// its context switches per operation (a transaction, a Send, a resolved
// check), everything on the machine counted. Only where the bench measured
// the brokers too: with --addr they may run elsewhere, and this machine's
// figures would be the clients' alone.
func (r *result) machine() (busyCores, switchesPerOp float64, ok bool) {
	if !r.usage.ok || !r.usage.machineOK || r.usage.wall <= 0 || r.Ops == 0 {
		return 0, 0, false
	}
	return r.usage.machine.Busy.Seconds() / r.usage.wall.Seconds(), float64(r.usage.machine.Switches) / float64(r.Ops), true
}

// cpuPer1000 is the brokers' CPU seconds per 1,000 writes.
func (r *result) cpuPer1000() (float64, bool) {
	if !r.usage.ok || r.Writes == 0 {
		return 0, false
	}
	return r.usage.cpu.Seconds() / float64(r.Writes) * 1000, true
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// object is the result as one flat JSON object, latencies in microseconds.
func (r *result) object() map[string]any {
	o := map[string]any{
		"workload":         r.Workload,
		"cluster":          r.Cluster,
		"nodes":            r.Nodes,
		"producers":        r.Producers,
		"consumers":        r.Consumers,
		"size_bytes":       r.Size,
		"duration_s":       r.Measured.Seconds(),
		"ops":              r.Ops,
		"errors":           r.Errors,
		"throughput_per_s": r.Throughput,
	}
	for _, l := range r.lats {
		o[l.key+"_count"] = l.s.Count
		o[l.key+"_mean_us"] = us(l.s.Mean)
		o[l.key+"_p50_us"] = us(l.s.P50)
		o[l.key+"_p95_us"] = us(l.s.P95)
		o[l.key+"_p99_us"] = us(l.s.P99)
		o[l.key+"_max_us"] = us(l.s.Max)
	}
	for _, e := range r.extras {
		o[e.key] = e.v
	}
	if r.OneProducer {
		o["one_producer"] = true
	}
	if r.Writes > 0 {
		o["writes"] = r.Writes
	}
	if r.usage.ok {
		o["broker_cpu_s"] = r.usage.cpu.Seconds()
		o["broker_cpu_cores"] = r.usage.cpu.Seconds() / r.usage.wall.Seconds()
		o["broker_peak_rss_mib"] = mib(r.usage.peakRSS)
	}
	if v, ok := r.cpuPer1000(); ok {
		o["broker_cpu_s_per_1000_writes"] = v
	}
	if busy, perOp, ok := r.machine(); ok {
		o["machine_busy_cores"], o["machine_switches_per_op"] = busy, perOp
	}
	if r.stages != nil {
		r.stages.fields(r, o)
	}
	if r.usage.heapOK {
		o["broker_peak_heap_mib"] = mib(r.usage.peakHeap)
	}
	if len(r.Notes) > 0 {
		o["notes"] = r.Notes
	}
	return o
}

func writeJSON(w io.Writer, r *result) error {
	return json.NewEncoder(w).Encode(r.object())
}

func writeTable(w io.Writer, r *result) {
	onOne := ""
	if r.OneProducer {
		onOne = " (on one Producer)"
	}
	fmt.Fprintf(w, "\n== %s: producers=%d%s consumers=%d size=%dB measured=%s on %s\n",
		r.Workload, r.Producers, onOne, r.Consumers, r.Size, r.Measured.Round(time.Millisecond), r.Cluster)
	fmt.Fprintf(w, "   throughput %.0f/s (%d ops, %d errors)\n", r.Throughput, r.Ops, r.Errors)
	for _, e := range r.extras {
		fmt.Fprintf(w, "   %-22s %12.4g  %s\n", e.key, e.v, e.what)
	}
	if len(r.lats) > 0 {
		fmt.Fprintf(w, "   %-8s %8s %9s %9s %9s %9s  (ms)\n", "latency", "count", "p50", "p95", "p99", "max")
		for _, l := range r.lats {
			fmt.Fprintf(w, "   %-8s %8d %9.3f %9.3f %9.3f %9.3f  %s\n", l.key, l.s.Count,
				us(l.s.P50)/1e3, us(l.s.P95)/1e3, us(l.s.P99)/1e3, us(l.s.Max)/1e3, l.what)
		}
	}
	if r.usage.ok {
		fmt.Fprintf(w, "   brokers: CPU %.2f s over %.1f s (%.2f cores)", r.usage.cpu.Seconds(), r.usage.wall.Seconds(), r.usage.cpu.Seconds()/r.usage.wall.Seconds())
		if v, ok := r.cpuPer1000(); ok {
			fmt.Fprintf(w, ", %.3f CPU s per 1,000 writes (%d writes)", v, r.Writes)
		}
		fmt.Fprintf(w, ", peak RSS %.0f MiB (largest node)", mib(r.usage.peakRSS))
		if r.usage.heapOK {
			fmt.Fprintf(w, ", peak Go heap in use %.0f MiB", mib(r.usage.peakHeap))
		}
		fmt.Fprintln(w)
	}
	if busy, perOp, ok := r.machine(); ok {
		fmt.Fprintf(w, "   machine: %.2f cores busy (brokers, clients, kernel), %.1f context switches per op\n", busy, perOp)
	}
	if r.stages != nil {
		r.stages.write(w, r)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "   note: %s\n", strings.TrimSpace(n))
	}
}
