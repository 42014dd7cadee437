package txmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

const (
	defaultAddr         = "127.0.0.1:7420"
	defaultRetryTimeout = 15 * time.Second
	retryBaseDelay      = 50 * time.Millisecond
	retryMaxDelay       = time.Second
)

// connectParams shortens gRPC's own reconnect backoff (up to 120 s by
// default): a broker that restarts should be reachable again within the
// client's retry window, not minutes later.
var connectParams = grpc.WithConnectParams(grpc.ConnectParams{
	Backoff: backoff.Config{
		BaseDelay:  100 * time.Millisecond,
		Multiplier: 1.6,
		Jitter:     0.2,
		MaxDelay:   2 * time.Second,
	},
	MinConnectTimeout: 5 * time.Second,
})

// maxRecv lets a delivery of the broker's largest message (4 MiB of body
// plus its envelope) through; gRPC's default receive limit is 4 MiB in all.
var maxRecv = grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16 << 20))

// dialDefaults fills in the connection settings shared by Producer and
// Consumer and says which one is wrong.
func dialDefaults(addrs []string, opts []grpc.DialOption, logger *slog.Logger) ([]string, []grpc.DialOption, *slog.Logger, error) {
	if len(addrs) == 0 {
		addrs = []string{defaultAddr}
	}
	for i, a := range addrs {
		if a == "" {
			return nil, nil, nil, invalidf("Addrs[%d] is empty", i)
		}
	}
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	// The caller's options come last so they can override these.
	opts = append([]grpc.DialOption{connectParams, maxRecv}, opts...)
	if logger == nil {
		logger = slog.Default()
	}
	return append([]string(nil), addrs...), opts, logger, nil
}

// pool holds one lazily created client connection per broker address and
// knows where the next call should go: to the leader a follower named, or
// else to the next configured address.
type pool struct {
	addrs       []string
	dialOptions []grpc.DialOption
	log         *slog.Logger

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	target string
	next   int // index in addrs of the address to rotate to
	closed bool
}

func newPool(addrs []string, dialOptions []grpc.DialOption, log *slog.Logger) *pool {
	return &pool{
		addrs:       addrs,
		dialOptions: dialOptions,
		log:         log,
		conns:       make(map[string]*grpc.ClientConn),
		target:      addrs[0],
		next:        1 % len(addrs),
	}
}

// pick returns the address the next call should use and its connection.
func (p *pool) pick() (string, *grpc.ClientConn, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", nil, ErrClosed
	}
	addr := p.target
	if cc, ok := p.conns[addr]; ok {
		return addr, cc, nil
	}
	// grpc.NewClient does not connect; the first call does.
	cc, err := grpc.NewClient(addr, p.dialOptions...)
	if err != nil {
		return "", nil, fmt.Errorf("txmq: client for %s: %w", addr, err)
	}
	p.conns[addr] = cc
	return addr, cc, nil
}

// failover moves the target away from addr after addr answered Unavailable:
// to leader when a follower named one, else to the next configured address.
// When concurrent calls fail on the same address only the first moves the
// target, so they do not skip addresses.
func (p *pool) failover(addr, leader string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target != addr {
		return
	}
	if leader != "" {
		p.target = leader
		return
	}
	p.target = p.addrs[p.next]
	p.next = (p.next + 1) % len(p.addrs)
}

func (p *pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// close closes every connection. Calls after it fail with ErrClosed.
func (p *pool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for addr, cc := range p.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("txmq: close connection to %s: %w", addr, err))
		}
	}
	p.conns = nil
	return errors.Join(errs...)
}

// attempt is one try of a unary RPC on cc; it must pass opts to the RPC.
type attempt func(ctx context.Context, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error

// invoke runs call, retrying Unavailable answers with capped exponential
// backoff and jitter until retryTimeout has passed or ctx ends. It follows
// NotLeader details to the leader and otherwise rotates through the
// configured addresses.
//
// idempotent says whether the broker deduplicates a repeat of the request.
// When it does not, invoke retries only when the broker certainly did not
// accept the request: a follower refused it (NotLeader), or the call never
// reached a connection. An Unavailable answer after the request went out
// (no quorum, a connection dropped mid-call) may hide a stored message.
func (p *pool) invoke(ctx context.Context, retryTimeout time.Duration, idempotent bool, call attempt) error {
	start := time.Now()
	delay := retryBaseDelay
	redirected := false
	for {
		addr, cc, err := p.pick()
		if err != nil {
			return err
		}
		var pr peer.Peer
		err = call(ctx, cc, grpc.Peer(&pr))
		if err == nil {
			return nil
		}
		if p.isClosed() {
			return ErrClosed
		}
		st, _ := status.FromError(err)
		if st.Code() != codes.Unavailable || ctx.Err() != nil {
			return fromStatus(err)
		}
		leader, refused := notLeader(st)
		p.failover(addr, leader)
		// The peer is only known once the call got onto a connection.
		if !idempotent && !refused && pr.Addr != nil {
			return fmt.Errorf("%w (not retried: the broker may have stored it; a message key makes retries safe)", fromStatus(err))
		}

		wait := delay/2 + rand.N(delay/2+1)
		delay = min(2*delay, retryMaxDelay)
		// Going straight to a newly named leader costs nothing; backing off
		// on the next redirect keeps two nodes with stale views from
		// bouncing a call between them in a tight loop.
		if leader != "" && leader != addr && !redirected {
			wait = 0
			redirected = true
		} else {
			redirected = false
		}
		if time.Since(start)+wait > retryTimeout {
			return fromStatus(err)
		}
		p.log.Debug("retrying unavailable broker", "addr", addr, "leader", leader, "wait", wait, "err", err)
		if ctxErr := sleep(ctx, wait); ctxErr != nil {
			return fmt.Errorf("txmq: %w while retrying (last error: %v)", ctxErr, fromStatus(err))
		}
	}
}

// notLeader reports whether st says the answering node is not the leader,
// and the leader's address when it knows one.
func notLeader(st *status.Status) (leader string, ok bool) {
	for _, d := range st.Details() {
		if nl, isNL := d.(*txmqv1.NotLeader); isNL {
			return nl.GetLeaderAddress(), true
		}
	}
	return "", false
}

// sleep waits for d or until ctx ends, whichever is first.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
