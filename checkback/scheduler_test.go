package checkback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

func TestMain(m *testing.M) { txmqtest.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// fakeClock is the scheduler's clock in tests.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

// fakeCaller answers checks with a function and records them.
type fakeCaller struct {
	mu     sync.Mutex
	answer func(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error)
	calls  []call
}

type call struct {
	at      time.Time
	ep      Endpoint
	msgID   string
	attempt uint32
}

func (f *fakeCaller) Check(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	f.mu.Lock()
	answer := f.answer
	f.mu.Unlock()
	return answer(ctx, ep, req)
}

func (f *fakeCaller) Close() error { return nil }

func (f *fakeCaller) record(clock *fakeClock, ep Endpoint, req *txmqv1.CheckTransactionRequest) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call{at: clock.Now(), ep: ep, msgID: req.MessageId, attempt: req.Attempt})
}

func (f *fakeCaller) callsOf(id string) []call {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []call
	for _, c := range f.calls {
		if c.msgID == id {
			out = append(out, c)
		}
	}
	return out
}

type env struct {
	t      testing.TB
	node   *raftlog.Node
	clock  *fakeClock
	caller *fakeCaller
	s      *Scheduler
	// scans counts the scheduler's looks at the schedule.
	scans atomic.Int64
}

// newEnv runs a scheduler, configured further by mod when set, on a
// single Raft node of the harness.
func newEnv(t testing.TB, mod func(*Config)) *env {
	t.Helper()
	node := txmqtest.NewCluster(t, 1, txmqtest.OpenRaft(nil)).Leader().Node()
	e := &env{t: t, node: node, clock: &fakeClock{now: t0}}
	e.caller = &fakeCaller{}
	e.answerWith(txmqv1.Resolution_RESOLUTION_UNKNOWN, nil)
	cfg := Config{
		Now:    e.clock.Now,
		Caller: e.caller,
		Jitter: func() float64 { return 1 },
		Logger: txmqtest.Logger(),
		// Fake time jumps minutes at once; registrations outlive it.
		Lease:       365 * 24 * time.Hour,
		ObserveScan: func(time.Duration) { e.scans.Add(1) },
	}
	if mod != nil {
		mod(&cfg)
	}
	var err error
	e.s, err = New(cfg, storeOf(node), node)
	require.NoError(t, err)
	return e
}

// nodeStore reads the schedule from a node's store, as the broker does.
type nodeStore struct{ s *halfstore.Store }

func (st nodeStore) ReadSchedule(fn func(Schedule) error) error {
	return st.s.View(func(tx *halfstore.Tx) error { return fn(tx) })
}

func storeOf(n *raftlog.Node) Store { return nodeStore{n.Store()} }

// answerWith makes every check answer res (or fail with err).
func (e *env) answerWith(res txmqv1.Resolution, err error) {
	e.caller.mu.Lock()
	defer e.caller.mu.Unlock()
	e.caller.answer = func(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
		e.caller.record(e.clock, ep, req)
		return res, err
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// sendHalf stores a half message created now (fake clock), first check due
// after checkAfter.
func (e *env) sendHalf(group, tx string, checkAfter time.Duration) string {
	e.t.Helper()
	r, err := e.node.SendHalf(ctxT(e.t), e.clock.Now(), &raftpb.SendHalf{
		Topic: "orders", MessageId: group + "-" + tx, ProducerGroup: group, TransactionId: tx,
		Body: []byte("body"), CreateTopic: true, CheckAfter: int64(checkAfter),
	})
	require.NoError(e.t, err)
	return r.Half.Id
}

// policy sets a producer group's policy fields.
func (e *env) policy(op *raftpb.UpdateProducerGroup) {
	e.t.Helper()
	_, err := e.node.UpdateProducerGroup(ctxT(e.t), t0, op)
	require.NoError(e.t, err)
}

func (e *env) half(id string) *storepb.Half {
	e.t.Helper()
	var h *storepb.Half
	require.NoError(e.t, e.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		h, err = tx.Half(id)
		return err
	}))
	return h
}

func (e *env) runOnce() {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(e.t, e.s.RunOnce(ctx))
}

func (e *env) register(group, id string) {
	e.s.Registry().Register(group, id, Endpoint{GRPC: "127.0.0.1:1"})
}

func TestCommitAndRollbackAnswersResolve(t *testing.T) {
	e := newEnv(t, nil)
	e.register("shop", "i1")
	committed := e.sendHalf("shop", "t1", 6*time.Second)
	e.clock.Set(t0.Add(5 * time.Second))
	e.runOnce()
	require.Empty(t, e.caller.callsOf(committed), "not due before check_after")

	e.answerWith(txmqv1.Resolution_RESOLUTION_COMMIT, nil)
	e.clock.Set(t0.Add(6 * time.Second))
	e.runOnce()
	h := e.half(committed)
	require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, h.State)
	require.Equal(t, storepb.Source_SOURCE_CHECKBACK, h.ResolutionSource)
	require.Equal(t, uint32(1), e.caller.callsOf(committed)[0].attempt)

	rolled := e.sendHalf("shop", "t2", 6*time.Second)
	e.answerWith(txmqv1.Resolution_RESOLUTION_ROLLBACK, nil)
	e.clock.Set(t0.Add(12 * time.Second))
	e.runOnce()
	require.Equal(t, storepb.HalfState_HALF_STATE_ROLLED_BACK, e.half(rolled).State)
	e.runOnce()
	require.Len(t, e.caller.callsOf(committed), 1, "a resolved message is never checked again")
	require.Len(t, e.caller.callsOf(rolled), 1)
}

// UNKNOWN forever: checks follow 6 s doubling to 60 s, then after 15 the
// message expires and is parked; an operator can still commit it.
func TestUnknownBacksOffThenExpires(t *testing.T) {
	e := newEnv(t, nil)
	e.register("shop", "i1")
	id := e.sendHalf("shop", "t1", 6*time.Second)
	for i := 0; i < 40 && e.half(id).State == storepb.HalfState_HALF_STATE_PENDING; i++ {
		e.clock.Set(time.Unix(0, e.half(id).NextCheckAt))
		e.runOnce()
	}
	h := e.half(id)
	require.Equal(t, storepb.HalfState_HALF_STATE_EXPIRED, h.State)
	require.Equal(t, storepb.Source_SOURCE_EXPIRY, h.ResolutionSource)
	require.Equal(t, uint32(15), h.CheckAttempts)

	calls := e.caller.callsOf(id)
	require.Len(t, calls, 15)
	var gaps []time.Duration
	for i := 1; i < len(calls); i++ {
		gaps = append(gaps, calls[i].at.Sub(calls[i-1].at))
		require.Equal(t, uint32(i+1), calls[i].attempt)
	}
	s := time.Second
	require.Equal(t, 6*s, calls[0].at.Sub(t0), "first check at created_at + check_after")
	require.Equal(t, []time.Duration{6 * s, 12 * s, 24 * s, 48 * s, 60 * s, 60 * s, 60 * s, 60 * s, 60 * s, 60 * s, 60 * s, 60 * s, 60 * s, 60 * s}, gaps)

	// Parked: listed as expired, and an operator commit delivers it.
	require.NoError(t, e.node.Store().View(func(tx *halfstore.Tx) error {
		hs, err := tx.ListHalf("", storepb.HalfState_HALF_STATE_EXPIRED, "", 10)
		require.Len(t, hs, 1)
		return err
	}))
	_, err := e.node.Resolve(ctxT(t), e.clock.Now(), &raftpb.Resolve{
		MessageId: id, Resolution: raftpb.Resolution_RESOLUTION_COMMIT, Source: storepb.Source_SOURCE_PRODUCER,
	})
	require.ErrorIs(t, err, halfstore.ErrExpired, "the producer API cannot resolve an expired message")
	r, err := e.node.Resolve(ctxT(t), e.clock.Now(), &raftpb.Resolve{
		MessageId: id, Resolution: raftpb.Resolution_RESOLUTION_COMMIT, Source: storepb.Source_SOURCE_OPERATOR,
	})
	require.NoError(t, err)
	require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, r.Half.State)
	require.Equal(t, uint64(1), r.Half.Sequence)
}

func TestErrorsCountButUnreachableDoesNot(t *testing.T) {
	e := newEnv(t, nil)
	e.register("shop", "i1")
	id := e.sendHalf("shop", "t1", 6*time.Second)
	e.answerWith(0, errors.New("database is down"))
	e.clock.Set(t0.Add(6 * time.Second))
	e.runOnce()
	h := e.half(id)
	require.Equal(t, uint32(1), h.CheckAttempts)
	require.Contains(t, h.LastCheckError, "database is down")
	require.Equal(t, t0.Add(12*time.Second).UnixNano(), h.NextCheckAt)

	e.answerWith(0, fmt.Errorf("%w: connection refused", ErrNotReached))
	e.clock.Set(t0.Add(12 * time.Second))
	e.runOnce()
	h = e.half(id)
	require.Equal(t, uint32(1), h.CheckAttempts, "a check that reached no producer uses no attempt")
	require.Contains(t, h.LastCheckError, "connection refused")
}

// Ten minutes of fake time without a registered producer: no attempt used,
// nothing called, nothing written. Once one registers, it is checked.
func TestNoInstanceUsesNoAttempts(t *testing.T) {
	e := newEnv(t, nil)
	id := e.sendHalf("shop", "t1", 6*time.Second)
	before, err := e.node.Store().AppliedIndex()
	require.NoError(t, err)
	for sec := 0; sec <= 600; sec += 5 {
		e.clock.Set(t0.Add(time.Duration(sec) * time.Second))
		e.runOnce()
	}
	h := e.half(id)
	require.Equal(t, storepb.HalfState_HALF_STATE_PENDING, h.State)
	require.Zero(t, h.CheckAttempts)
	require.Empty(t, e.caller.callsOf(id))
	after, err := e.node.Store().AppliedIndex()
	require.NoError(t, err)
	require.Equal(t, before, after, "waiting for a producer writes nothing")

	e.answerWith(txmqv1.Resolution_RESOLUTION_COMMIT, nil)
	e.register("shop", "i1")
	e.runOnce()
	require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, e.half(id).State)
}

func TestTooOldWithoutInstanceExpires(t *testing.T) {
	e := newEnv(t, nil)
	e.policy(&raftpb.UpdateProducerGroup{
		Name: "shop", MaxHalfAge: proto.Int64(int64(time.Hour)), ExpiryAction: storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK.Enum(),
	})
	id := e.sendHalf("shop", "t1", 6*time.Second)
	e.clock.Set(t0.Add(59 * time.Minute))
	e.runOnce()
	require.Equal(t, storepb.HalfState_HALF_STATE_PENDING, e.half(id).State)
	e.clock.Set(t0.Add(61 * time.Minute))
	e.runOnce()
	h := e.half(id)
	require.Equal(t, storepb.HalfState_HALF_STATE_ROLLED_BACK, h.State, "expiry action rollback")
	require.Equal(t, storepb.Source_SOURCE_EXPIRY, h.ResolutionSource)
	require.Zero(t, h.CheckAttempts)
}

// The producer commits while a check is in flight, and the check answers
// ROLLBACK: the message stays committed, in the topic once.
func TestLateAnswerChangesNothing(t *testing.T) {
	e := newEnv(t, nil)
	e.register("shop", "i1")
	id := e.sendHalf("shop", "t1", 6*time.Second)
	inCall := make(chan struct{})
	release := make(chan struct{})
	e.caller.mu.Lock()
	e.caller.answer = func(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
		close(inCall)
		<-release
		return txmqv1.Resolution_RESOLUTION_ROLLBACK, nil
	}
	e.caller.mu.Unlock()
	e.clock.Set(t0.Add(6 * time.Second))
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.runOnce()
	}()
	<-inCall
	_, err := e.node.Resolve(ctxT(t), e.clock.Now(), &raftpb.Resolve{
		MessageId: id, Resolution: raftpb.Resolution_RESOLUTION_COMMIT, Source: storepb.Source_SOURCE_PRODUCER,
	})
	require.NoError(t, err)
	close(release)
	<-done
	h := e.half(id)
	require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, h.State)
	require.Equal(t, storepb.Source_SOURCE_PRODUCER, h.ResolutionSource)
	require.NoError(t, e.node.Store().View(func(tx *halfstore.Tx) error {
		tp, err := tx.Topic("orders")
		require.Equal(t, uint64(1), tp.LastSequence)
		return err
	}))
}

func TestRoundRobinWithinTheGroupOnly(t *testing.T) {
	e := newEnv(t, nil)
	e.s.Registry().Register("shop", "a", Endpoint{GRPC: "127.0.0.1:1001"})
	e.s.Registry().Register("shop", "b", Endpoint{GRPC: "127.0.0.1:1002"})
	e.s.Registry().Register("billing", "c", Endpoint{GRPC: "127.0.0.1:1003"})
	var ids []string
	for i := 0; i < 6; i++ {
		ids = append(ids, e.sendHalf("shop", fmt.Sprint("t", i), 6*time.Second))
	}
	e.clock.Set(t0.Add(6 * time.Second))
	e.runOnce()
	seen := map[string]int{}
	for _, id := range ids {
		calls := e.caller.callsOf(id)
		require.Len(t, calls, 1)
		seen[calls[0].ep.GRPC]++
	}
	require.Equal(t, map[string]int{"127.0.0.1:1001": 3, "127.0.0.1:1002": 3}, seen)
}

func TestStaticCallbackWhenNoInstance(t *testing.T) {
	e := newEnv(t, nil)
	e.policy(&raftpb.UpdateProducerGroup{Name: "shop", CallbackUrl: proto.String("http://127.0.0.1:9/check")})
	id := e.sendHalf("shop", "t1", 6*time.Second)
	e.answerWith(txmqv1.Resolution_RESOLUTION_COMMIT, nil)
	e.clock.Set(t0.Add(6 * time.Second))
	e.runOnce()
	require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, e.half(id).State)
	require.Equal(t, "http://127.0.0.1:9/check", e.caller.callsOf(id)[0].ep.HTTP)
}

// A group whose producer hangs does not slow another group down: its
// checks are bounded per group, and the other group's go on.
func TestSlowGroupDoesNotStarveOthers(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.Now = time.Now
		c.CallTimeout = 5 * time.Second
		c.MaxPerGroup = 4
		c.MaxConcurrent = 8
	})
	stuck := make(chan struct{})
	defer close(stuck)
	e.caller.mu.Lock()
	e.caller.answer = func(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
		if req.ProducerGroup == "slow" {
			select {
			case <-stuck:
			case <-ctx.Done():
			}
			return 0, ctx.Err()
		}
		return txmqv1.Resolution_RESOLUTION_COMMIT, nil
	}
	e.caller.mu.Unlock()
	e.register("slow", "s")
	e.register("fast", "f")
	past := time.Now().Add(-time.Minute)
	e.clock.Set(past)
	for i := 0; i < 30; i++ {
		e.sendHalf("slow", fmt.Sprint("t", i), time.Second)
	}
	var fast []string
	for i := 0; i < 40; i++ {
		fast = append(fast, e.sendHalf("fast", fmt.Sprint("t", i), time.Second))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.Run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()
	txmqtest.CheckFor(t, 3*time.Second, 20*time.Millisecond, func() error {
		pending := 0
		for _, id := range fast {
			if e.half(id).State == storepb.HalfState_HALF_STATE_PENDING {
				pending++
			}
		}
		if pending > 0 {
			return fmt.Errorf("%d fast-group messages still pending while the slow group hangs", pending)
		}
		return nil
	})
	e.s.mu.Lock()
	require.LessOrEqual(t, e.s.perGroup["slow"], 4, "the slow group stays within its bound")
	e.s.mu.Unlock()
}

func TestCheckNow(t *testing.T) {
	e := newEnv(t, nil)
	e.register("shop", "i1")
	id := e.sendHalf("shop", "t1", time.Hour)
	e.answerWith(txmqv1.Resolution_RESOLUTION_COMMIT, nil)
	out, h, err := e.s.CheckNow(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_COMMIT, out.Answer)
	require.Equal(t, "i1", out.Instance)
	require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, h.State)
	_, _, err = e.s.CheckNow(context.Background(), id)
	require.ErrorIs(t, err, ErrNotPending, "only pending messages are checked")
	_, _, err = e.s.CheckNow(context.Background(), "nope")
	require.ErrorIs(t, err, halfstore.ErrNotFound)
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Policy.Backoff = time.Minute; c.Policy.MaxBackoff = time.Second }, "backoff"},
		{func(c *Config) { c.Policy.MaxHalfAge = time.Millisecond }, "MaxHalfAge"},
		{func(c *Config) { c.MaxPerGroup = 100; c.MaxConcurrent = 10 }, "MaxPerGroup"},
		{func(c *Config) { c.Lease = time.Second; c.HeartbeatInterval = time.Minute }, "Lease"},
		{func(c *Config) { c.MaxProposals = -1 }, "MaxProposals"},
	} {
		var c Config
		tc.mod(&c)
		require.ErrorContains(t, c.Defaults().Validate(), tc.want)
	}
}

// A backlog of due messages (a new leader inheriting a schedule) is worked
// off within the concurrency bound, with no burst beyond it.
func TestBacklogStaysWithinTheBound(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrent = 6
		c.MaxPerGroup = 3
	})
	var mu sync.Mutex
	inFlight, peak := 0, 0
	e.caller.mu.Lock()
	e.caller.answer = func(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
		mu.Lock()
		inFlight++
		peak = max(peak, inFlight)
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		inFlight--
		mu.Unlock()
		return txmqv1.Resolution_RESOLUTION_COMMIT, nil
	}
	e.caller.mu.Unlock()
	var ids []string
	for _, g := range []string{"a", "b", "c"} {
		e.register(g, "i")
		for i := 0; i < 20; i++ {
			ids = append(ids, e.sendHalf(g, fmt.Sprint("t", i), time.Second))
		}
	}
	e.clock.Set(t0.Add(time.Minute))
	for round := 0; round < 30; round++ {
		e.runOnce()
	}
	for _, id := range ids {
		require.Equal(t, storepb.HalfState_HALF_STATE_COMMITTED, e.half(id).State)
	}
	require.LessOrEqual(t, peak, 6)
	require.Greater(t, peak, 1, "checks do run in parallel")
}

// funcProposer lets a test hold or count proposals before they reach Raft;
// op is the command's operation (*raftpb.Resolve, ...).
type funcProposer struct {
	next   Proposer
	before func(ctx context.Context, op proto.Message)
	after  func(op proto.Message)
}

func (p funcProposer) Resolve(ctx context.Context, now time.Time, op *raftpb.Resolve) (raftlog.HalfResult, error) {
	p.before(ctx, op)
	defer p.after(op)
	return p.next.Resolve(ctx, now, op)
}

func (p funcProposer) RecordCheck(ctx context.Context, now time.Time, op *raftpb.RecordCheck) (raftlog.HalfResult, error) {
	p.before(ctx, op)
	defer p.after(op)
	return p.next.RecordCheck(ctx, now, op)
}

func (p funcProposer) Expire(ctx context.Context, now time.Time, op *raftpb.Expire) (raftlog.HalfResult, error) {
	p.before(ctx, op)
	defer p.after(op)
	return p.next.Expire(ctx, now, op)
}

// withProposer replaces the env's scheduler by one proposing through p.
func (e *env) withProposer(p Proposer) {
	e.withStoreAndProposer(storeOf(e.node), p)
}

func (e *env) withStoreAndProposer(st Store, p Proposer) {
	e.t.Helper()
	s, err := New(e.s.Config(), st, p)
	require.NoError(e.t, err)
	e.s = s
}

// gatedStore, once armed, holds the next read transaction open before the
// scheduler reads from it.
type gatedStore struct {
	next   Store
	armed  atomic.Bool
	opened chan struct{}
	gate   chan struct{}
}

func (g *gatedStore) ReadSchedule(fn func(Schedule) error) error {
	return g.next.ReadSchedule(func(tx Schedule) error {
		if g.armed.CompareAndSwap(true, false) {
			close(g.opened)
			<-g.gate
		}
		return fn(tx)
	})
}

func (e *env) run() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.s.Run(ctx)
	}()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
}

func (e *env) waitCommitted(ids []string) {
	e.t.Helper()
	txmqtest.CheckFor(e.t, 10*time.Second, 5*time.Millisecond, func() error {
		for _, id := range ids {
			if st := e.half(id).State; st != storepb.HalfState_HALF_STATE_COMMITTED {
				return fmt.Errorf("%s still %s", id, st)
			}
		}
		return nil
	})
}

// claimed reports whether the scheduler holds a message: a check or its
// outcome is under way.
func (e *env) claimed(id string) bool {
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	return e.s.inflight[id]
}

// The per-group bound holds calls to producers, not Raft writes: while the
// resolution of one check waits for Raft, the group's only slot already
// serves the next check, and the message being resolved is not checked
// again.
func TestCallSlotIsFreeWhileTheOutcomeIsProposed(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrent = 1
		c.MaxPerGroup = 1
	})
	gate := make(chan struct{})
	resolving := make(chan string, 2)
	e.withProposer(funcProposer{next: e.node,
		before: func(ctx context.Context, op proto.Message) {
			if r, ok := op.(*raftpb.Resolve); ok {
				resolving <- r.MessageId
				select {
				case <-gate:
				case <-ctx.Done():
				}
			}
		},
		after: func(proto.Message) {},
	})
	e.answerWith(txmqv1.Resolution_RESOLUTION_COMMIT, nil)
	e.register("shop", "i1")
	ids := []string{e.sendHalf("shop", "t1", time.Second), e.sendHalf("shop", "t2", time.Second)}
	e.clock.Set(t0.Add(time.Minute))
	e.run()

	var held []string
	for range ids {
		select {
		case id := <-resolving:
			held = append(held, id)
		case <-time.After(10 * time.Second):
			t.Fatalf("only %v reached Raft: the slot is still held by a blocked proposal", held)
		}
	}
	require.ElementsMatch(t, ids, held, "both resolutions in flight at once with one slot")
	for _, id := range ids {
		require.Len(t, e.caller.callsOf(id), 1, "a message whose resolution is in flight is not checked again")
	}
	close(gate)
	e.waitCommitted(ids)
}

// With Raft slow, calls to producers stay within MaxPerGroup and
// MaxConcurrent, and proposals within MaxProposals.
func TestBoundsHoldWhileProposalsAreSlow(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.MaxConcurrent = 6
		c.MaxPerGroup = 3
		c.MaxProposals = 8
	})
	var mu sync.Mutex
	calls, callPeak := 0, 0
	group, groupPeak := map[string]int{}, 0
	props, propPeak := 0, 0
	e.caller.mu.Lock()
	e.caller.answer = func(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
		mu.Lock()
		calls++
		group[req.ProducerGroup]++
		callPeak, groupPeak = max(callPeak, calls), max(groupPeak, group[req.ProducerGroup])
		mu.Unlock()
		time.Sleep(time.Millisecond)
		mu.Lock()
		calls--
		group[req.ProducerGroup]--
		mu.Unlock()
		return txmqv1.Resolution_RESOLUTION_COMMIT, nil
	}
	e.caller.mu.Unlock()
	e.withProposer(funcProposer{next: e.node,
		before: func(context.Context, proto.Message) {
			mu.Lock()
			props++
			propPeak = max(propPeak, props)
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		},
		after: func(proto.Message) {
			mu.Lock()
			props--
			mu.Unlock()
		},
	})
	var ids []string
	for _, g := range []string{"a", "b", "c"} {
		e.register(g, "i")
		for i := 0; i < 20; i++ {
			ids = append(ids, e.sendHalf(g, fmt.Sprint("t", i), time.Second))
		}
	}
	e.clock.Set(t0.Add(time.Minute))
	e.run()
	e.waitCommitted(ids)

	mu.Lock()
	defer mu.Unlock()
	require.LessOrEqual(t, groupPeak, 3, "calls in flight to one group")
	require.LessOrEqual(t, callPeak, 6, "calls in flight in all")
	require.LessOrEqual(t, propPeak, 8, "proposals in flight")
	require.Greater(t, propPeak, 3, "proposals overlap beyond one group's call bound")
}

// A scan whose read transaction opened before a resolution was applied
// still sees the message as due; it must not check it again once the
// resolution is proposed ("a message that is already resolved is never
// checked").
func TestScanOlderThanAResolutionDoesNotCheckAgain(t *testing.T) {
	e := newEnv(t, nil)
	st := &gatedStore{next: storeOf(e.node), opened: make(chan struct{}), gate: make(chan struct{})}
	resolving := make(chan struct{})
	proposed := make(chan struct{})
	var first sync.Once
	e.withStoreAndProposer(st, funcProposer{next: e.node,
		before: func(ctx context.Context, op proto.Message) {
			if _, ok := op.(*raftpb.Resolve); ok {
				first.Do(func() {
					close(resolving)
					<-proposed
				})
			}
		},
		after: func(proto.Message) {},
	})
	e.answerWith(txmqv1.Resolution_RESOLUTION_COMMIT, nil)
	e.register("shop", "i1")
	id := e.sendHalf("shop", "t1", time.Second)
	e.clock.Set(t0.Add(time.Minute))
	e.run()

	<-resolving
	st.armed.Store(true)
	<-st.opened // a round's snapshot from before the resolution
	close(proposed)
	e.waitCommitted([]string{id})
	txmqtest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		if e.claimed(id) {
			return fmt.Errorf("%s is still claimed", id)
		}
		return nil
	})
	before := e.scans.Load()
	close(st.gate)
	// The round that read the old snapshot finishes, then another one; a
	// check either of them started would be over once nothing holds the
	// message.
	txmqtest.CheckFor(t, 10*time.Second, time.Millisecond, func() error {
		e.s.Wake()
		if n := e.scans.Load() - before; n < 2 {
			return fmt.Errorf("%d rounds done since the gate opened", n)
		}
		if e.claimed(id) {
			return fmt.Errorf("%s is being checked", id)
		}
		return nil
	})
	require.Len(t, e.caller.callsOf(id), 1, "a resolved message is never checked")
}
