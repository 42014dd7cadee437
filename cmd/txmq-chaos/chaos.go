package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/prototext"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/cmd/txmq-chaos/lazyfs"
)

// Config is one chaos run.
type Config struct {
	BrokerBin   string
	Dir         string
	Nodes       int
	Producers   int
	Faults      []string      // nemeses, in schedule order
	AllVariants bool          // run every variant of each fault once (--short), else one each round
	Hold        time.Duration // how long a fault stays on
	Interval    time.Duration // calm between faults
	Duration    time.Duration // faults keep rotating until then (0: one round)
	Drain       time.Duration // bound of the drain after the heal
	History     string
	Out         io.Writer
	// BrokenFsync makes the wal's fsync lie on the lazy file system: a
	// power cut then also drops what it synced in the last 3 s. The run
	// must fail with lost writes: it shows that powercut bites.
	BrokenFsync bool
	// NotRun are faults left out of the schedule, with why (reported as
	// skipped).
	NotRun []string
}

// Chaos is a run in progress.
type Chaos struct {
	cfg       Config
	c         *Cluster
	hist      *History
	w         *Workload
	corrupted []CorruptResult
	skipped   []string
	lazyErr   error
	current   string // the nemesis and variant running
	start     time.Time
	// mu guards the output and corrupted: the faults of a combination
	// run at once.
	mu sync.Mutex
}

func (x *Chaos) logf(format string, args ...any) {
	x.mu.Lock()
	defer x.mu.Unlock()
	fmt.Fprintf(x.cfg.Out, "%6.1fs  %s\n", time.Since(x.start).Seconds(), fmt.Sprintf(format, args...))
}

// Report is what a run found.
type Report struct {
	Result
	PendingLeft, Expired int
	// NonLinearizable are the transactions whose half message, as the
	// history saw it, is not a linearizable register (Linearize).
	NonLinearizable []string
	Converged       bool
	// Proxied Raft connections, and those whose dialer was not told.
	Proxied, UnknownDialer int64
	ConvergeDetail         string
	Corrupted              []CorruptResult
	Skipped                []string
	Elapsed                time.Duration
}

// Failed reports whether a must-be-0 figure is not 0, or the stores
// diverged.
func (r Report) Failed() bool {
	return len(r.Lost) > 0 || len(r.Ghosts) > 0 || r.PendingLeft > 0 || len(r.NonLinearizable) > 0 || !r.Converged
}

// Run starts the cluster and the workload, runs the faults, heals,
// drains and checks.
func Run(ctx context.Context, cfg Config) (Report, error) {
	x := &Chaos{cfg: cfg, hist: &History{}, start: time.Now(), skipped: cfg.NotRun}
	c, err := NewCluster(cfg.BrokerBin, cfg.Dir, cfg.Nodes, x.logf)
	if err != nil {
		return Report{}, err
	}
	x.c = c
	defer c.Close()
	x.mountLazy()
	if err := c.StartAll(); err != nil {
		return Report{}, err
	}
	leader, err := c.WaitLeader(ctx, 60*time.Second)
	if err != nil {
		return Report{}, err
	}
	x.logf("%d brokers up in %s, leader %s; logs in %s/n*.log", cfg.Nodes, cfg.Dir, leader, cfg.Dir)
	w, err := NewWorkload(c.Addrs(), cfg.Producers, x.hist)
	if err != nil {
		return Report{}, err
	}
	x.w = w
	defer w.Close()
	w.Start()
	sleep(ctx, cfg.Interval)
	if err := x.schedule(ctx); err != nil {
		return Report{}, err
	}
	x.healAll()
	sleep(ctx, cfg.Interval)
	w.StopProducing()
	x.logf("faults over, producers stopped; draining (at most %v)", cfg.Drain)
	rep := x.drain(ctx)
	rep.NonLinearizable = Linearize(x.hist.Events())
	if len(rep.Lost)+len(rep.Ghosts) > 0 {
		x.evidence(ctx, rep.Result)
	}
	w.Close()
	rep.Converged, rep.ConvergeDetail = x.converge(ctx)
	rep.Proxied, rep.UnknownDialer = c.net.accepted.Load(), c.net.unknown.Load()
	rep.Corrupted, rep.Skipped, rep.Elapsed = x.corrupted, x.skipped, time.Since(x.start)
	if cfg.History != "" {
		if err := x.hist.WriteFile(cfg.History); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// mountLazy puts the data directories on the lazy file system when a
// fault needs it; when it cannot, those faults are skipped with the
// reason.
func (x *Chaos) mountLazy() {
	need := x.cfg.BrokenFsync
	for _, f := range x.cfg.Faults {
		need = need || needsLazy(f)
	}
	if !need {
		return
	}
	var cfg lazyfs.Config
	if x.cfg.BrokenFsync {
		cfg = lazyfs.Config{LyingSync: ".wal", Window: 3 * time.Second}
	}
	if err := x.c.MountLazy(cfg); err != nil {
		x.lazyErr = err
		x.logf("no lazy file system (%v): powercut, disk-full and slow-disk are skipped", err)
		x.c.lazy = nil
		return
	}
	x.logf("data directories on the lazy file system (FUSE; backing directories n*.disk)%s",
		map[bool]string{true: "; BROKEN: the wal's fsync lies for 3 s", false: ""}[x.cfg.BrokenFsync])
}

// schedule runs the faults in turn, with calm between them.
func (x *Chaos) schedule(ctx context.Context) error {
	var runnable []Nemesis
	for _, f := range x.cfg.Faults {
		if needsLazy(f) && x.c.lazy == nil {
			why := fmt.Sprintf("needs the lazy file system (FUSE: /dev/fuse and root): %v", x.lazyErr)
			x.skipped = append(x.skipped, f+": "+why)
			x.logf("skipped %s: %s", f, why)
			continue
		}
		n, err := nemesisFor(f)
		if err != nil {
			return err
		}
		runnable = append(runnable, n)
	}
	if len(runnable) == 0 {
		return nil
	}
	used := map[string]int{}
	for round := 0; ctx.Err() == nil; round++ {
		for _, n := range runnable {
			if x.cfg.AllVariants && used[n.name] >= len(n.variants) {
				continue
			}
			v := n.variants[used[n.name]%len(n.variants)]
			used[n.name]++
			x.current = n.name + " " + v
			if err := n.run(ctx, x, v, x.cfg.Hold); err != nil {
				return fmt.Errorf("%s %s: %w", n.name, v, err)
			}
			x.healAll()
			sleep(ctx, x.cfg.Interval)
			if x.cfg.Duration > 0 && time.Since(x.start) >= x.cfg.Duration {
				return nil
			}
		}
		if x.done(runnable, used) {
			return nil
		}
	}
	return ctx.Err()
}

func (x *Chaos) done(runnable []Nemesis, used map[string]int) bool {
	if x.cfg.Duration > 0 {
		return time.Since(x.start) >= x.cfg.Duration
	}
	if !x.cfg.AllVariants {
		return true
	}
	for _, n := range runnable {
		if used[n.name] < len(n.variants) {
			return false
		}
	}
	return true
}

// healAll lifts every network fault, continues paused nodes and starts
// stopped ones.
func (x *Chaos) healAll() {
	x.c.net.Heal()
	for _, id := range x.c.IDs() {
		x.c.Resume(id)
		if !x.c.Running(id) {
			x.logf("%s was not running after its fault; starting it", id)
			if err := x.c.Start(id, nil); err != nil {
				x.logf("start %s: %v", id, err)
			}
		}
	}
}

// drain waits until no half message is pending and every group got what
// the checker expects, or until the drain bound; the report is the last
// check.
func (x *Chaos) drain(ctx context.Context) Report {
	var rep Report
	deadline := time.Now().Add(x.cfg.Drain)
	for {
		rep.Result = Check(x.hist.Events(), groups)
		var err error
		rep.PendingLeft, rep.Expired, err = x.pending(ctx)
		if err == nil && rep.PendingLeft == 0 && len(rep.Lost) == 0 {
			x.logf("drained: nothing pending, every group has every committed message")
			return rep
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			x.logf("drain bound reached: %d pending, %d lost (err %v)", rep.PendingLeft, len(rep.Lost), err)
			if err != nil {
				rep.PendingLeft = -1
			}
			return rep
		}
		sleep(ctx, time.Second)
	}
}

// pending counts the half messages still pending, and the expired ones,
// on the leader.
func (x *Chaos) pending(ctx context.Context) (pending, expired int, err error) {
	leader, err := x.c.Leader(ctx)
	if err != nil {
		return 0, 0, err
	}
	for _, st := range []txmqv1.HalfState{txmqv1.HalfState_HALF_STATE_PENDING, txmqv1.HalfState_HALF_STATE_EXPIRED} {
		token, n := "", 0
		for {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := x.c.Admin(leader).ListHalfMessages(cctx, &txmqv1.ListHalfMessagesRequest{State: st, Limit: 1000, PageToken: token})
			cancel()
			if err != nil {
				return 0, 0, err
			}
			n += len(resp.GetMessages())
			if token = resp.GetNextPageToken(); token == "" {
				break
			}
		}
		if st == txmqv1.HalfState_HALF_STATE_PENDING {
			pending = n
		} else {
			expired = n
		}
	}
	return pending, expired, nil
}

// evidence prints, for the first findings, the operation, the broker's
// view of the message and the nodes' log lines that name it.
func (x *Chaos) evidence(ctx context.Context, r Result) {
	findings := append(append([]Finding{}, r.Lost...), r.Ghosts...)
	for i, f := range findings {
		if i == 10 {
			x.logf("... and %d more", len(findings)-10)
			break
		}
		x.logf("EVIDENCE %s (group %s): %+v", f.Why, f.Group, f.Op)
		if f.Op.MsgID == "" {
			continue
		}
		if leader, err := x.c.Leader(ctx); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			resp, err := x.c.Admin(leader).GetHalfMessage(cctx, &txmqv1.GetHalfMessageRequest{MessageId: f.Op.MsgID})
			cancel()
			if err == nil {
				x.logf("  broker (%s): %s", leader, prototext.Format(resp.GetMessage()))
			} else {
				x.logf("  broker (%s): %v", leader, err)
			}
		}
		for _, id := range x.c.IDs() {
			for _, l := range grepLog(x.c.node(id).logPath, f.Op.MsgID, 8) {
				x.logf("  %s.log: %s", id, l)
			}
		}
	}
}

// grepLog returns up to max lines of a log that contain s.
func grepLog(path, s string, limit int) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for l := range strings.SplitSeq(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
			if len(out) == limit {
				break
			}
		}
	}
	return out
}
