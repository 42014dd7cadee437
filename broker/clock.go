package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// The cluster's time. Every time the broker stamps into a command
// (created_at, check schedules, ack deadlines, retention cut-offs) or
// schedules by is the cluster's, not one machine's: this machine's clock
// (Config.Now) plus the lower median of the offsets of the voters' clocks
// from it, this node counting as offset 0. A leader whose clock is hours
// off therefore stamps the others' time. Every node asks every other voter
// for its clock once a second (AdminService.Clock), so a node that is
// elected already holds fresh samples. docs/decisions.md › Cluster time.

const (
	// clockEvery is how often a node samples the other voters' clocks.
	clockEvery = time.Second
	// clockFresh is how long a sample counts.
	clockFresh = 10 * time.Second
	// clockAgreeWait bounds how long a new leader waits for a majority
	// of fresh samples before its first stamp.
	clockAgreeWait = 2 * time.Second
	// clockSkewWarn: a voter whose clock is further than this from the
	// cluster's time is named in a warning.
	clockSkewWarn = time.Second
)

var (
	descClockOffset = prometheus.NewDesc("txmq_cluster_clock_offset_seconds",
		"The cluster's time minus this machine's clock, as this node chose it (lower median of the voters' clock offsets).", nil, nil)
	descClockAgreed = prometheus.NewDesc("txmq_cluster_clock_agreed",
		"1 when a majority of the voters' clocks answered within the last 10 s (the cluster's time is theirs), 0 when this node falls back to the last offset agreed (or its own clock, if none).", nil, nil)
	descClockSkew = prometheus.NewDesc("txmq_cluster_clock_skew_seconds",
		"Each voter's clock minus the cluster's time, from this node's latest fresh sample (this node included).", []string{"node"}, nil)
)

// errNoAddress: a voter's API address is not in the member list yet (a
// new cluster, before its members announced themselves).
var errNoAddress = errors.New("no API address recorded yet")

// clockSample is one answer of a voter's clock.
type clockSample struct {
	offset time.Duration // its clock minus this machine's, at the middle of the call
	at     time.Time     // this machine's clock when it arrived
}

// clusterClock is the cluster's time as this node knows it.
type clusterClock struct {
	self    string
	machine func() time.Time
	// floor is the latest time stamped into an applied command: the
	// clock never goes below it (zero: none yet).
	floor    func() time.Time
	isLeader func() bool
	log      *slog.Logger
	wait     time.Duration

	last atomic.Int64 // the latest time handed out as the leader, Unix ns
	kick chan struct{}

	mu sync.Mutex
	// known: peers and voter are the configuration as the latest round
	// read it (not yet, or not since this node was elected: unknown).
	known bool
	peers []string // the other voters
	voter bool     // this node is a voter

	samples map[string]clockSample
	errs    map[string]error // the latest failed sample of each peer
	// offset is the latest offset a majority agreed on, 0 before the
	// first: what the clock falls back to without a majority.
	offset time.Duration
	// leaderAt is when this node became the leader (real time; zero when
	// it is not); warned: it stamped without agreement in this term.
	leaderAt time.Time
	warned   bool
	skewed   map[string]bool
	changed  chan struct{} // closed and replaced on every news
}

func newClusterClock(self string, machine, floor func() time.Time, isLeader func() bool, log *slog.Logger) *clusterClock {
	return &clusterClock{
		self: self, machine: machine, floor: floor, isLeader: isLeader, log: log, wait: clockAgreeWait,
		kick: make(chan struct{}, 1), samples: map[string]clockSample{}, errs: map[string]error{},
		skewed: map[string]bool{}, changed: make(chan struct{}),
	}
}

// Now is the cluster's time. On the leader, what it stamps, it never
// goes backwards: not below a time it handed out, nor below the latest
// stamp applied. A leader without a majority of fresh samples waits for
// them, at most clockAgreeWait after its election, before it stamps the
// last agreed offset (or its own clock). A follower's reading (for
// display: ages, lags) is not kept as a floor, so a follower that has not
// heard the others yet does not hold a later leader to its own clock.
func (c *clusterClock) Now() time.Time {
	t, leader := c.read()
	ns := t.UnixNano()
	if f := c.floor(); !f.IsZero() {
		ns = max(ns, f.UnixNano())
	}
	for leader {
		last := c.last.Load()
		if ns <= last {
			return time.Unix(0, last)
		}
		if c.last.CompareAndSwap(last, ns) {
			break
		}
	}
	return time.Unix(0, ns)
}

// read is the estimate, after the new leader's wait for agreement, and
// whether this node is the leader.
func (c *clusterClock) read() (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if !c.isLeader() {
			t, _ := c.estimate()
			return t, false
		}
		if c.leaderAt.IsZero() {
			c.startTermLocked()
		}
		t, agreed := c.estimate()
		if agreed {
			return t, true
		}
		left := c.wait - time.Since(c.leaderAt)
		if left <= 0 {
			if !c.warned {
				c.warned = true
				c.log.Warn("cluster clock: no majority of the voters' clocks answered; the leader stamps the last agreed offset from its own clock",
					"offset", c.offset, "voters", len(c.peers)+1, "errors", c.errorsLocked())
			}
			return t, true
		}
		news := c.changed
		c.mu.Unlock()
		timer := time.NewTimer(left)
		select {
		case <-news:
		case <-timer.C:
		}
		timer.Stop()
		c.mu.Lock()
	}
}

// estimate is this machine's clock plus the lower median of the fresh
// offsets when they are a majority of the voters (agreed), or plus the
// last agreed offset.
func (c *clusterClock) estimate() (time.Time, bool) {
	now := c.machine()
	offs := c.freshLocked(now)
	voters := len(c.peers)
	if c.voter {
		voters++
	}
	if !c.known || voters == 0 || len(offs) < voters/2+1 {
		return now.Add(c.offset), false
	}
	c.offset = lowerMedian(offs)
	return now.Add(c.offset), true
}

// freshLocked lists the offsets of this node (0, if it is a voter) and
// of the peers sampled within clockFresh.
func (c *clusterClock) freshLocked(now time.Time) []time.Duration {
	var offs []time.Duration
	if c.voter {
		offs = append(offs, 0)
	}
	for _, id := range c.peers {
		if s, ok := c.samples[id]; ok && now.Sub(s.at) < clockFresh {
			offs = append(offs, s.offset)
		}
	}
	return offs
}

// lowerMedian is the middle offset, the lower of the two middle ones for
// an even count: when the voters split evenly, the earlier time wins
// (a half message expires late rather than early).
func lowerMedian(offs []time.Duration) time.Duration {
	s := slices.Clone(offs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

// setLeader starts (or ends) this node's term as the leader.
func (c *clusterClock) setLeader(leader bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case !leader:
		c.leaderAt = time.Time{}
	case c.leaderAt.IsZero():
		c.startTermLocked()
	}
}

// startTermLocked starts a term as the leader (when the node learns it,
// or at its first reading as the leader, whichever comes first): the
// voter list is read again, and the samples taken at once, before the
// first stamp.
func (c *clusterClock) startTermLocked() {
	c.leaderAt, c.warned, c.known = time.Now(), false, false
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// setPeers records the other voters, and whether this node is one (a
// node that has not joined yet, or was removed, is not); samples of
// former voters are dropped.
func (c *clusterClock) setPeers(peers []string, voter bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.known, c.peers, c.voter = true, peers, voter
	for id := range c.samples {
		if !slices.Contains(peers, id) {
			delete(c.samples, id)
		}
	}
	for id := range c.errs {
		if !slices.Contains(peers, id) {
			delete(c.errs, id)
		}
	}
	c.newsLocked()
}

// record keeps a peer's sample, or the error of a failed one.
func (c *clusterClock) record(id string, s clockSample, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		c.errs[id] = err
	} else {
		delete(c.errs, id)
		c.samples[id] = s
	}
	c.newsLocked()
}

func (c *clusterClock) newsLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *clusterClock) errorsLocked() string {
	if len(c.errs) == 0 {
		return "none"
	}
	var out string
	for id, err := range c.errs {
		out += fmt.Sprintf("%s: %v; ", id, err)
	}
	return out[:len(out)-2]
}

// skews is each voter's clock minus the cluster's time (this node's
// included), for the voters with a fresh sample, and whether they agree.
func (c *clusterClock) skews() (map[string]time.Duration, time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, agreed := c.estimate()
	now := c.machine()
	out := map[string]time.Duration{c.self: -c.offset}
	for _, id := range c.peers {
		if s, ok := c.samples[id]; ok && now.Sub(s.at) < clockFresh {
			out[id] = s.offset - c.offset
		}
	}
	return out, c.offset, agreed
}

// review warns once when a voter's clock goes further than clockSkewWarn
// from the cluster's time, and says when it is back. It reports whether
// a majority of the voters' clocks agree.
func (c *clusterClock) review() bool {
	sk, _, agreed := c.skews()
	if !agreed {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, d := range sk {
		far := d > clockSkewWarn || d < -clockSkewWarn
		switch {
		case far && !c.skewed[id]:
			c.log.Warn("cluster clock: a voter's clock is off the cluster's time; the cluster's time is the voters' median, not that clock",
				"voter", id, "skew", d)
		case !far && c.skewed[id]:
			c.log.Info("cluster clock: a voter's clock is back near the cluster's time", "voter", id, "skew", d)
		}
		c.skewed[id] = far
	}
	return true
}

// Describe and Collect export the clock on /metrics.
func (c *clusterClock) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descClockOffset, descClockAgreed, descClockSkew} {
		ch <- d
	}
}

func (c *clusterClock) Collect(ch chan<- prometheus.Metric) {
	sk, offset, agreed := c.skews()
	ch <- prometheus.MustNewConstMetric(descClockOffset, prometheus.GaugeValue, offset.Seconds())
	ag := 0.0
	if agreed {
		ag = 1
	}
	ch <- prometheus.MustNewConstMetric(descClockAgreed, prometheus.GaugeValue, ag)
	for id, d := range sk {
		ch <- prometheus.MustNewConstMetric(descClockSkew, prometheus.GaugeValue, d.Seconds(), id)
	}
}

// sampleClocks asks the other voters for their clocks every clockEvery
// (at once when this node is elected, and every tenth of it while they
// do not agree), until the broker stops.
// Connections are kept per address.
func (b *Broker) sampleClocks() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-b.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	conns := map[string]*grpc.ClientConn{}
	defer func() {
		for _, cc := range conns {
			cc.Close()
		}
	}()
	for {
		b.clockRound(ctx, conns)
		wait := clockEvery
		if !b.clock.review() {
			// A new member, or a new cluster whose members have just
			// announced their addresses: the next round soon.
			wait = clockEvery / 10
		}
		timer := time.NewTimer(wait)
		select {
		case <-b.stop:
			timer.Stop()
			return
		case <-timer.C:
		case <-b.clock.kick:
			timer.Stop()
		}
	}
}

// clockRound samples every other voter once, in parallel.
func (b *Broker) clockRound(ctx context.Context, conns map[string]*grpc.ClientConn) {
	voters, err := b.node.Voters()
	if err != nil {
		b.log.Debug("cluster clock: no voter list", "err", err)
		return
	}
	voter := slices.Contains(voters, b.node.ID())
	peers := slices.DeleteFunc(voters, func(id string) bool { return id == b.node.ID() })
	b.clock.setPeers(peers, voter)
	used := map[string]bool{}
	var wg sync.WaitGroup
	for _, id := range peers {
		addr := b.nodeAddr(id)
		if addr == "" {
			b.clock.record(id, clockSample{}, errNoAddress)
			continue
		}
		used[addr] = true
		cc := conns[addr]
		if cc == nil {
			if cc, err = grpc.NewClient(addr, b.peerDialOptions()...); err != nil {
				b.clock.record(id, clockSample{}, err)
				continue
			}
			conns[addr] = cc
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := b.sampleClock(ctx, cc)
			b.clock.record(id, s, err)
		}()
	}
	wg.Wait()
	for addr, cc := range conns {
		if !used[addr] {
			cc.Close()
			delete(conns, addr)
		}
	}
}

// sampleClock asks one voter for its clock: its offset from this
// machine's is its answer minus the middle of the call.
func (b *Broker) sampleClock(ctx context.Context, cc grpc.ClientConnInterface) (clockSample, error) {
	ctx, cancel := context.WithTimeout(ctx, clockEvery)
	defer cancel()
	sent := b.cfg.Now()
	resp, err := txmqv1.NewAdminServiceClient(cc).Clock(ctx, &txmqv1.ClockRequest{})
	if err != nil {
		return clockSample{}, err
	}
	got := b.cfg.Now()
	mid := sent.Add(got.Sub(sent) / 2)
	return clockSample{offset: time.Unix(0, resp.UnixNanos).Sub(mid), at: got}, nil
}

// Clock answers this machine's clock (Config.Now), for the other members'
// samples.
func (s *adminService) Clock(context.Context, *txmqv1.ClockRequest) (*txmqv1.ClockResponse, error) {
	return &txmqv1.ClockResponse{UnixNanos: s.b.cfg.Now().UnixNano()}, nil
}
