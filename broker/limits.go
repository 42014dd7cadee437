package broker

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/txmq/txmq/checkback"
	"golang.org/x/time/rate"
)

// Limits bound what one principal may ask of the broker (with auth on;
// without it there are no principals). A principal's own limits in the
// auth file replace these.
type Limits struct {
	// Requests per second (a burst of one second's worth).
	Requests float64
	// Bytes of requests per second.
	Bytes float64
	// Streams open at once (sessions and subscriptions).
	Streams int
	// Instances registered for check-backs per producer group.
	Instances int
}

// Default limits: generous, so that only a runaway client meets them.
const (
	DefaultPrincipalRequests = 20000
	DefaultPrincipalBytes    = 256 << 20
	DefaultPrincipalStreams  = 1000
	DefaultGroupInstances    = 1000
)

// Defaults fills the zero fields.
func (l Limits) Defaults() Limits {
	if l.Requests == 0 {
		l.Requests = DefaultPrincipalRequests
	}
	if l.Bytes == 0 {
		l.Bytes = DefaultPrincipalBytes
	}
	if l.Streams == 0 {
		l.Streams = DefaultPrincipalStreams
	}
	if l.Instances == 0 {
		l.Instances = DefaultGroupInstances
	}
	return l
}

func (l Limits) validate() error {
	if l.Requests < 0 || l.Bytes < 0 || l.Streams < 0 || l.Instances < 0 {
		return fmt.Errorf("limits must not be negative: %+v", l)
	}
	return nil
}

// limiter keeps each principal's rate buckets and open streams.
type limiter struct {
	def Limits
	m   *metrics

	mu      sync.Mutex
	buckets map[string]*buckets
}

type buckets struct {
	requests, bytes *rate.Limiter
	streams, max    int
}

func newLimiter(def Limits, m *metrics) *limiter {
	m.limit.WithLabelValues("requests_per_second").Set(def.Requests)
	m.limit.WithLabelValues("bytes_per_second").Set(def.Bytes)
	m.limit.WithLabelValues("streams").Set(float64(def.Streams))
	m.limit.WithLabelValues("instances_per_producer_group").Set(float64(def.Instances))
	return &limiter{def: def, m: m, buckets: map[string]*buckets{}}
}

// reset forgets the buckets (a reload may change a principal's limits);
// open streams stay counted.
func (l *limiter) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, bk := range l.buckets {
		if bk.streams == 0 {
			delete(l.buckets, name)
		}
	}
}

func (l *limiter) of(pr *principal) *buckets {
	bk := l.buckets[pr.name]
	if bk != nil {
		return bk
	}
	lim := l.def
	if pr.limits.Requests > 0 {
		lim.Requests = pr.limits.Requests
	}
	if pr.limits.Bytes > 0 {
		lim.Bytes = pr.limits.Bytes
	}
	if pr.limits.Streams > 0 {
		lim.Streams = pr.limits.Streams
	}
	bk = &buckets{
		requests: rate.NewLimiter(rate.Limit(lim.Requests), max(1, int(lim.Requests))),
		// A burst of at least one largest message, so that any message
		// can pass at some point.
		bytes: rate.NewLimiter(rate.Limit(lim.Bytes), max(int(lim.Bytes), DefaultMaxMessage+1<<20)),
		max:   lim.Streams,
	}
	l.buckets[pr.name] = bk
	return bk
}

// allow takes one request of size bytes from the principal's buckets, or
// refuses with when to retry.
func (l *limiter) allow(pr *principal, size int) error {
	l.mu.Lock()
	bk := l.of(pr)
	l.mu.Unlock()
	now := time.Now()
	r := bk.requests.ReserveN(now, 1)
	if wait := r.DelayFrom(now); wait > 0 {
		r.CancelAt(now)
		l.m.limited.WithLabelValues("requests").Inc()
		return refusef(errLimited, "principal %q is over its limit of %g requests/s; retry in %s", pr.name, float64(bk.requests.Limit()), wait.Round(time.Millisecond))
	}
	b := bk.bytes.ReserveN(now, size)
	if wait := b.DelayFrom(now); !b.OK() || wait > 0 {
		b.CancelAt(now)
		l.m.limited.WithLabelValues("bytes").Inc()
		return refusef(errLimited, "principal %q is over its limit of %g request bytes/s; retry in %s", pr.name, float64(bk.bytes.Limit()), wait.Round(time.Millisecond))
	}
	return nil
}

// openStream counts a stream of the principal until release is called.
func (l *limiter) openStream(pr *principal) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk := l.of(pr)
	if bk.streams >= bk.max {
		l.m.limited.WithLabelValues("streams").Inc()
		return nil, refusef(errLimited, "principal %q has %d streams open, its limit; close one and retry", pr.name, bk.streams)
	}
	bk.streams++
	return func() {
		l.mu.Lock()
		bk.streams--
		l.mu.Unlock()
	}, nil
}

// checkInstances refuses a new instance of a producer group that has as
// many registered as Limits.Instances; one registering again is let in.
func (b *Broker) checkInstances(group, id string) error {
	list := b.checks.Registry().List(group)
	if len(list) < b.cfg.Limits.Instances || slices.ContainsFunc(list, func(in checkback.Instance) bool { return in.ID == id }) {
		return nil
	}
	b.metrics.limited.WithLabelValues("instances").Inc()
	return refusef(errLimited, "producer group %q has %d instances registered, its limit; retry once one has unregistered or its lease (%s) has run out",
		group, len(list), b.checks.Config().Lease)
}

// securityMetrics: decisions of the audit and the limits.
func (m *metrics) securityMetrics() {
	m.audit = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "txmq_audit_events_total",
		Help: "Calls or stream requests logged by the audit (auth on), by decision: deny, unauthenticated, limited, and allow for admin writes.",
	}, []string{"decision"})
	m.limit = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "txmq_limit",
		Help: "The default per-principal limits (auth on) and the per-producer-group limit of registered instances, by limit.",
	}, []string{"limit"})
	m.limited = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "txmq_limit_refusals_total",
		Help: "Requests refused with ResourceExhausted by a limit, by limit (requests, bytes, streams, instances).",
	}, []string{"limit"})
	m.reg.MustRegister(m.audit, m.limit, m.limited)
}
