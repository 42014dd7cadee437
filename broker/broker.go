// Package broker serves txmq's gRPC API on top of a Raft node: the producer,
// consumer and admin services, delivery of committed messages to consumer
// groups, and the mapping of errors to gRPC status codes.
//
// Writes become raftlog commands stamped with the cluster's time (the
// voters' median clock, clock.go); reads come
// from the node's halfstore. Delivery runs on the leader only: one
// dispatcher per (topic, consumer group) reads the topic log from the
// group's acked position and pushes to the group's streams.
package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/internal/window"
	"github.com/txmq/txmq/raftlog"
)

// Broker is one running txmq node: Raft, store, gRPC server, delivery.
type Broker struct {
	cfg    Config
	log    *slog.Logger
	node   *raftlog.Node
	grpc   *grpc.Server
	lis    net.Listener
	ids    *idGen
	notify *notifier
	checks *checkback.Scheduler
	// clock is the cluster's time, stamped into commands (clock.go).
	clock *clusterClock
	// auth authenticates and authorizes calls; nil when auth is off.
	auth *authorizer
	// guard decides which producer callbacks may be called.
	guard *checkback.Guard
	// metrics and the HTTP server of /metrics, /healthz, /readyz.
	metrics *metrics
	http    *http.Server
	httpLis net.Listener

	mu          sync.Mutex
	dispatchers map[groupKey]*dispatcher
	leaderEpoch uint64 // bumped on every leadership change
	// demoted is closed, and replaced, when the node stops being the
	// leader (sessioncheck.go).
	demoted chan struct{}

	stop     chan struct{}
	wg       sync.WaitGroup
	closeErr error
	once     sync.Once
}

// Open starts the Raft node and serves the gRPC API on cfg.GRPCAddr.
func Open(cfg Config) (*Broker, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Broker{
		cfg:         cfg,
		log:         cfg.Logger.With("component", "broker", "node", cfg.Raft.NodeID),
		ids:         newIDGen(),
		notify:      newNotifier(),
		dispatchers: map[groupKey]*dispatcher{},
		demoted:     make(chan struct{}),
		stop:        make(chan struct{}),
	}
	b.metrics = newMetrics(b)
	var err error
	if b.auth, err = newAuthorizer(b); err != nil {
		return nil, err
	}
	if b.guard, err = checkback.NewGuard(cfg.CallbackAllow); err != nil {
		return nil, err
	}
	installRaftStages()
	rc := cfg.Raft
	rc.OnApply = b.onApply
	rc.Hooks = b.metrics.hooks(cfg.Raft.Hooks)
	node, err := raftlog.Open(rc)
	if err != nil {
		return nil, err
	}
	b.node = node
	b.clock = newClusterClock(node.ID(), cfg.Now, node.LatestStamp, node.IsLeader,
		cfg.Logger.With("component", "clock", "node", node.ID()))
	b.metrics.reg.MustRegister(b.clock)
	cb := cfg.CheckBack
	cb.Now = b.clock.Now
	cb.Guard = b.guard
	cb.Observe = b.metrics.observeCheck
	cb.ObserveScan = func(d time.Duration) { b.metrics.checkScan.Observe(d.Seconds()) }
	if b.checks, err = checkback.New(cb, scheduleStore{node.Store()}, node); err != nil {
		node.Close()
		return nil, err
	}
	if err := b.listen(); err != nil {
		node.Close()
		return nil, err
	}
	b.serve()
	b.log.Info("broker started", "grpc_addr", b.Addr(), "raft_addr", node.RaftAddr(), "data", cfg.Raft.Dir)
	return b, nil
}

// listen opens the gRPC listener and, when configured, the metrics one.
func (b *Broker) listen() error {
	cfg := b.cfg
	b.lis = cfg.GRPCListener
	if b.lis == nil {
		var err error
		if b.lis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
			return fmt.Errorf("broker: listen %s: %w", cfg.GRPCAddr, err)
		}
	}
	b.httpLis = cfg.MetricsListener
	if b.httpLis == nil && cfg.MetricsAddr != "" {
		var err error
		if b.httpLis, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			b.lis.Close()
			return fmt.Errorf("broker: metrics listen %s: %w", cfg.MetricsAddr, err)
		}
	}
	return nil
}

// serve starts the gRPC and metrics servers and the node's background
// work: health, announcing itself, leadership.
func (b *Broker) serve() {
	// Room for the largest body plus its envelope, so that an oversized
	// body reaches validation and gets a clear InvalidArgument.
	limit := b.cfg.MaxMessageSize + 1<<20
	opts := append(window.ServerOptions(), grpc.MaxRecvMsgSize(limit), grpc.MaxSendMsgSize(limit), b.serverCredentials(),
		grpc.ChainUnaryInterceptor(b.metrics.unary, b.statusUnary, b.auth.unary),
		grpc.ChainStreamInterceptor(b.metrics.stream, b.statusStream, b.auth.stream))
	if b.auth != nil {
		opts = append(opts, grpc.StatsHandler(connTracker{b.auth.limits}))
	}
	b.grpc = grpc.NewServer(opts...)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(b.grpc, hs)
	txmqv1.RegisterProducerServiceServer(b.grpc, &producerService{b: b})
	txmqv1.RegisterConsumerServiceServer(b.grpc, &consumerService{b: b})
	txmqv1.RegisterAdminServiceServer(b.grpc, &adminService{b: b})
	// Reflection lets grpcurl and other tools list and call the API
	// without the .proto files.
	reflection.Register(b.grpc)
	run := func(f func()) {
		b.wg.Add(1)
		go func() {
			defer b.wg.Done()
			f()
		}()
	}
	if b.httpLis != nil {
		b.http = b.newHTTPServer()
		run(func() {
			if err := b.http.Serve(b.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				b.log.Error("metrics server stopped", "err", err)
			}
		})
	}
	run(func() { b.watchHealth(hs) })
	run(b.announce)
	run(b.sampleClocks)
	run(func() {
		if err := b.grpc.Serve(b.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			b.log.Error("grpc server stopped", "err", err)
		}
	})
	run(b.watchLeadership)
}

// MetricsAddr is where /metrics, /healthz and /readyz are served, "" if off.
func (b *Broker) MetricsAddr() string {
	if b.httpLis == nil {
		return ""
	}
	return b.httpLis.Addr().String()
}

// Addr is the address the gRPC API listens on.
func (b *Broker) Addr() string { return b.lis.Addr().String() }

// Node is the broker's Raft node.
func (b *Broker) Node() *raftlog.Node { return b.node }

// WaitReady blocks until this node is the leader and has applied everything
// committed before, or until ctx ends. For tests and single-node start-up.
func (b *Broker) WaitReady(ctx context.Context) error {
	if err := b.node.WaitLeader(ctx); err != nil {
		return err
	}
	if !b.node.IsLeader() {
		return nil
	}
	return b.node.Barrier(ctx)
}

// HandOver makes another voter the leader when this node is the leader,
// so that stopping it (a rolling restart) costs no election: writes pause
// for the transfer, not for an election timeout. It waits for the transfer
// at most until ctx ends (hashicorp/raft bounds it by an election timeout
// too); a node that is not the leader, or alone, has nothing to hand over.
func (b *Broker) HandOver(ctx context.Context) error {
	if !b.node.IsLeader() {
		return nil
	}
	st, err := b.node.Status()
	if err != nil {
		return err
	}
	voters := 0
	for _, m := range st.Members {
		if m.Suffrage == "Voter" {
			voters++
		}
	}
	if voters < 2 {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- b.node.TransferLeadership("") }()
	select {
	case err = <-done:
	case <-ctx.Done():
		return fmt.Errorf("broker: hand over leadership: %w", ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("broker: hand over leadership: %w", err)
	}
	id, _ := b.node.Leader()
	b.log.Info("leadership handed over before stopping", "new_leader", id)
	return nil
}

// Close stops the node: consumer streams end (their unacked deliveries are
// redelivered), Raft and the store close, then the gRPC server stops once
// the calls in flight have failed over. Everything acknowledged is already
// durable.
func (b *Broker) Close() error {
	b.once.Do(func() {
		close(b.stop)
		b.stopDispatchers()
		// Raft goes first: the other nodes elect a new leader at once, and
		// calls still in flight here fail with Unavailable, which clients
		// retry elsewhere.
		nodeErr := b.node.Close()
		done := make(chan struct{})
		go func() {
			b.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			b.grpc.Stop()
			<-done
		}
		var httpErr error
		if b.httpLis != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			httpErr = b.http.Shutdown(sctx)
			cancel()
			// Serve may not have started, and then does not close it.
			b.httpLis.Close()
		}
		b.wg.Wait()
		b.closeErr = errors.Join(nodeErr, httpErr, b.checks.Close())
		b.log.Info("broker stopped")
	})
	return b.closeErr
}

// watchLeadership runs the leader's background work (check-backs,
// retention) while this node is the leader, and stops delivery when it
// stops being the leader: consumers reconnect to the new leader, which
// resumes from the acked positions.
func (b *Broker) watchLeadership() {
	var run *leaderRun
	defer func() { run.stop() }()
	for {
		select {
		case <-b.stop:
			return
		case leader := <-b.node.LeaderCh():
			b.log.Info("leadership changed", "leader", leader)
			b.stopDispatchers()
			run.stop()
			run = nil
			b.clock.setLeader(leader)
			if leader {
				run = b.startLeaderRun()
			} else {
				b.demote()
			}
		}
	}
}

// leaderRun is the leader's background work for one term of leadership.
type leaderRun struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (b *Broker) startLeaderRun() *leaderRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &leaderRun{cancel: cancel}
	// Registrations made with an earlier leader are not known here:
	// producers register again when their heartbeat is refused.
	b.checks.Registry().Reset()
	r.wg.Add(2)
	go func() {
		defer r.wg.Done()
		b.checks.Run(ctx)
	}()
	go func() {
		defer r.wg.Done()
		b.runRetention(ctx)
	}()
	return r
}

func (r *leaderRun) stop() {
	if r == nil {
		return
	}
	r.cancel()
	r.wg.Wait()
}

func (b *Broker) stopDispatchers() {
	b.mu.Lock()
	ds := b.dispatchers
	b.dispatchers = map[groupKey]*dispatcher{}
	b.leaderEpoch++
	b.mu.Unlock()
	for _, d := range ds {
		d.close(errDispatcherClosed)
	}
}

// scheduleStore gives the check-back scheduler its consistent reads.
type scheduleStore struct{ s *halfstore.Store }

func (st scheduleStore) ReadSchedule(fn func(checkback.Schedule) error) error {
	return st.s.View(func(tx *halfstore.Tx) error { return fn(tx) })
}
