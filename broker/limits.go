package broker

import (
	"context"
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
	// Connections open at once on which the principal has made a call.
	Conns int
	// Instances registered for check-backs per producer group.
	Instances int
}

// Default limits: generous, so that only a runaway client meets them.
const (
	DefaultPrincipalRequests = 20000
	DefaultPrincipalBytes    = 256 << 20
	DefaultPrincipalStreams  = 1000
	DefaultPrincipalConns    = 1000
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
	if l.Conns == 0 {
		l.Conns = DefaultPrincipalConns
	}
	if l.Instances == 0 {
		l.Instances = DefaultGroupInstances
	}
	return l
}

func (l Limits) validate() error {
	if l.Requests < 0 || l.Bytes < 0 || l.Streams < 0 || l.Conns < 0 || l.Instances < 0 {
		return fmt.Errorf("limits must not be negative: %+v", l)
	}
	return nil
}

// limiter keeps each principal's rate buckets, open streams and open
// connections.
type limiter struct {
	def Limits
	m   *metrics

	mu      sync.Mutex
	buckets map[string]*buckets
}

type buckets struct {
	requests, bytes     *rate.Limiter
	streams, maxStreams int
	conns, maxConns     int
}

func newLimiter(def Limits, m *metrics) *limiter {
	m.limit.WithLabelValues("requests_per_second").Set(def.Requests)
	m.limit.WithLabelValues("bytes_per_second").Set(def.Bytes)
	m.limit.WithLabelValues("streams").Set(float64(def.Streams))
	m.limit.WithLabelValues("connections").Set(float64(def.Conns))
	m.limit.WithLabelValues("instances_per_producer_group").Set(float64(def.Instances))
	return &limiter{def: def, m: m, buckets: map[string]*buckets{}}
}

// reset applies a reloaded auth file: principals with nothing open are
// forgotten, the others keep their counts and take their new limits.
func (l *limiter) reset(pol *aclPolicy) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, bk := range l.buckets {
		pr := pol.principals[name]
		switch {
		case bk.streams == 0 && bk.conns == 0:
			delete(l.buckets, name)
		case pr != nil:
			bk.set(l.limitsOf(pr))
		}
	}
}

// limitsOf are the principal's limits: its own from the auth file, the
// defaults for the rest.
func (l *limiter) limitsOf(pr *principal) Limits {
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
	if pr.limits.Conns > 0 {
		lim.Conns = pr.limits.Conns
	}
	return lim
}

// set applies new limits; the buckets keep the tokens they hold.
func (bk *buckets) set(lim Limits) {
	bk.requests.SetLimit(rate.Limit(lim.Requests))
	bk.requests.SetBurst(requestBurst(lim))
	bk.bytes.SetLimit(rate.Limit(lim.Bytes))
	bk.bytes.SetBurst(byteBurst(lim))
	bk.maxStreams, bk.maxConns = lim.Streams, lim.Conns
}

// A burst of one second's worth of requests; of bytes, at least one
// largest message, so that any message can pass at some point.
func requestBurst(lim Limits) int { return max(1, int(lim.Requests)) }
func byteBurst(lim Limits) int    { return max(int(lim.Bytes), DefaultMaxMessage+1<<20) }

func (l *limiter) of(pr *principal) *buckets {
	bk := l.buckets[pr.name]
	if bk != nil {
		return bk
	}
	lim := l.limitsOf(pr)
	bk = &buckets{
		requests:   rate.NewLimiter(rate.Limit(lim.Requests), requestBurst(lim)),
		bytes:      rate.NewLimiter(rate.Limit(lim.Bytes), byteBurst(lim)),
		maxStreams: lim.Streams, maxConns: lim.Conns,
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

// wait takes one request of size bytes from the principal's buckets,
// waiting until they hold enough.
func (l *limiter) wait(ctx context.Context, pr *principal, size int) error {
	l.mu.Lock()
	bk := l.of(pr)
	l.mu.Unlock()
	if err := bk.requests.Wait(ctx); err != nil {
		return err
	}
	if err := bk.bytes.WaitN(ctx, size); err != nil && ctx.Err() == nil {
		return refusef(errLimited, "principal %q: a request of %d bytes is over its limit of %g request bytes/s", pr.name, size, float64(bk.bytes.Limit()))
	}
	return ctx.Err()
}

// openStream counts a stream of the principal until release is called.
func (l *limiter) openStream(pr *principal) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk := l.of(pr)
	if bk.streams >= bk.maxStreams {
		l.m.limited.WithLabelValues("streams").Inc()
		return nil, refusef(errLimited, "principal %q has %d streams open, its limit; close one and retry", pr.name, bk.streams)
	}
	bk.streams++
	l.m.principalStreams.WithLabelValues(pr.name).Set(float64(bk.streams))
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		bk.streams--
		l.m.principalStreams.WithLabelValues(pr.name).Set(float64(bk.streams))
	}, nil
}

// openConn counts a connection of the principal until closeConn.
func (l *limiter) openConn(pr *principal) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk := l.of(pr)
	if bk.conns >= bk.maxConns {
		l.m.limited.WithLabelValues("connections").Inc()
		return refusef(errLimited, "principal %q has %d connections open, its limit; close one and retry", pr.name, bk.conns)
	}
	bk.conns++
	l.m.principalConns.WithLabelValues(pr.name).Set(float64(bk.conns))
	return nil
}

// closeConn uncounts a connection openConn counted: its entry is kept
// while it has connections open.
func (l *limiter) closeConn(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	bk := l.buckets[name]
	bk.conns--
	l.m.principalConns.WithLabelValues(name).Set(float64(bk.conns))
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
		Help: "Requests refused with ResourceExhausted by a limit, by limit (requests, bytes, streams, connections, instances).",
	}, []string{"limit"})
	m.principalStreams = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "txmq_principal_streams",
		Help: "Streams (sessions, subscriptions) open, by principal (auth on).",
	}, []string{"principal"})
	m.principalConns = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "txmq_principal_connections",
		Help: "Connections open on which the principal has made a call, by principal (auth on).",
	}, []string{"principal"})
	m.reg.MustRegister(m.audit, m.limit, m.limited, m.principalStreams, m.principalConns)
}
