package txmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/window"
)

const (
	defaultAddr         = "127.0.0.1:7420"
	defaultRetryTimeout = 15 * time.Second
	// maxRedirects bounds the NotLeader answers a call follows in a row, so
	// that nodes with stale views of the leader cannot bounce it between
	// them: after that many it tries the next configured address.
	maxRedirects = 3
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

// ConnConfig configures a Conn. Every field has a usable zero value.
type ConnConfig struct {
	// Addrs are gRPC addresses (host:port) of nodes of one txmq cluster.
	// Any will do: a follower names the leader and calls move there.
	// Duplicates count once. Default 127.0.0.1:7420.
	Addrs []string
	// DialOptions are passed to grpc.NewClient after the Conn's own (a
	// 16 MiB receive limit, a reconnect backoff capped at 2 s), so they can
	// override them, and after the transport credentials: TLS when TLS is
	// set, else insecure (plaintext).
	DialOptions []grpc.DialOption
	// Token is sent as a bearer token with every call, for a broker with
	// an auth file (docs/security.md). Without TLS in DialOptions it is
	// sent to loopback addresses only.
	Token string
	// TLS, when set, secures the connections to the brokers: RootCAs
	// verifies them, Certificates (or GetClientCertificate) is the client
	// certificate a broker with --tls-client-auth asks for.
	TLS *tls.Config
	// Logger receives the retries, at debug level. Default slog.Default().
	Logger *slog.Logger
	// RetryTimeout bounds how long a call keeps retrying while the cluster
	// is Unavailable (leader change, no quorum, nodes down). Default 15 s.
	RetryTimeout time.Duration
}

// Conn is a client connection to a txmq cluster: one gRPC connection per
// node, made on first use, and the knowledge of where the next call should
// go. Calls that a follower refuses with a NotLeader detail move to the
// leader it names; other Unavailable answers move on to the next configured
// address, with capped exponential backoff and jitter, until RetryTimeout.
// Producer and Consumer use one each; Conn is for programs that call the
// broker's services themselves, such as an admin tool. It is safe for
// concurrent use.
type Conn struct {
	addrs        []string
	dialOptions  []grpc.DialOption
	log          *slog.Logger
	retryTimeout time.Duration

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	target string
	next   int // index in addrs of the address to rotate to
	closed bool
}

// Dial checks cfg and returns a Conn. It does not connect: the first call
// to each node does. It fails when an address is empty or gRPC refuses it
// as a target, and when RetryTimeout is negative.
func Dial(cfg ConnConfig) (*Conn, error) {
	addrs := cfg.Addrs
	if len(addrs) == 0 {
		addrs = []string{defaultAddr}
	}
	for i, a := range addrs {
		if a == "" {
			return nil, invalidf("Addrs[%d] is empty", i)
		}
	}
	switch {
	case cfg.RetryTimeout < 0:
		return nil, invalidf("RetryTimeout %v is negative", cfg.RetryTimeout)
	case cfg.RetryTimeout == 0:
		cfg.RetryTimeout = defaultRetryTimeout
	}
	opts := append([]grpc.DialOption{transportCredentials(cfg.TLS)}, cfg.DialOptions...)
	if cfg.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(TokenCredentials(cfg.Token)))
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Conn{
		addrs:        dedup(addrs),
		dialOptions:  append(append([]grpc.DialOption{connectParams, maxRecv}, window.DialOptions()...), opts...),
		log:          log,
		retryTimeout: cfg.RetryTimeout,
		conns:        make(map[string]*grpc.ClientConn),
	}
	c.target = c.addrs[0]
	c.next = 1 % len(c.addrs)
	// grpc.NewClient does not connect; it only checks the target.
	for _, a := range c.addrs {
		if _, err := c.connLocked(a); err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	return c, nil
}

// dedup keeps the first of each address, in order.
func dedup(addrs []string) []string {
	var out []string
	for _, a := range addrs {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// Call is one attempt of a request: it runs an RPC on cc, the connection to
// the node at addr, and must pass opts on to it.
type Call func(ctx context.Context, addr string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error

// Invoke runs call on the leader: first where the last call went, then
// following NotLeader answers, and on other Unavailable answers trying the
// next address, with backoff, until RetryTimeout has passed or ctx's
// deadline would. Any other answer is final. Errors match this package's
// sentinels (ErrUnavailable once the retries are given up), keep the gRPC
// status for status.FromError, and match ctx's error when ctx ended them.
//
// idempotent says whether repeating the request is safe: the broker
// deduplicates it (a transaction ID, a message key) or it changes nothing
// the second time (reads, commits, configuration). When it is not, Invoke
// retries only when the broker certainly did not take the request: a
// follower refused it, or it never reached a connection. An Unavailable
// answer after the request went out (no quorum, a connection dropped
// mid-call) may hide a request that took effect; it is returned with
// "(not retried: the request may have taken effect)" added to its message.
func (c *Conn) Invoke(ctx context.Context, idempotent bool, call Call) error {
	return c.invoke(ctx, toLeader, "", idempotent, call)
}

// InvokeAny runs call on the first node that answers, whichever it is, for
// a request every node serves, such as AdminService.ClusterStatus. It does
// not follow NotLeader: any Unavailable moves on to the next address, with
// backoff, until RetryTimeout. call must be safe to repeat.
func (c *Conn) InvokeAny(ctx context.Context, call Call) error {
	return c.invoke(ctx, toAny, "", true, call)
}

// InvokeOn runs call on the node at addr and no other, for a request about
// that node, such as AdminService.TakeSnapshot. It retries Unavailable
// there, with backoff, until RetryTimeout; a NotLeader answer is final.
// call must be safe to repeat. addr need not be one of ConnConfig.Addrs.
func (c *Conn) InvokeOn(ctx context.Context, addr string, call Call) error {
	if addr == "" {
		return invalidf("address is empty")
	}
	return c.invoke(ctx, toNode, addr, true, call)
}

// Follow tells c that a stream a Call opened on addr ended with err, so that
// the next Invoke goes where err says: to the leader a NotLeader detail
// names, else, for any other Unavailable, to the next address. Other errors
// change nothing.
func (c *Conn) Follow(addr string, err error) {
	st := status.Convert(err)
	if st.Code() != codes.Unavailable {
		return
	}
	leader, _ := notLeader(st)
	c.failover(addr, leader)
}

// Close closes every connection. Calls after it fail with ErrClosed.
func (c *Conn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for addr, cc := range c.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("txmq: close connection to %s: %w", addr, err))
		}
	}
	c.conns = nil
	return errors.Join(errs...)
}

// route is where a call may go.
type route int

const (
	toLeader route = iota
	toAny
	toNode
)

// invoke is Invoke, InvokeAny and InvokeOn: node is InvokeOn's address.
func (c *Conn) invoke(ctx context.Context, r route, node string, idempotent bool, call Call) error {
	pace := c.newPacer(ctx)
	streak := 0             // NotLeader redirects followed in a row
	var last *status.Status // the last Unavailable, once retrying
	for {
		addr, cc, err := c.pick(node)
		if err != nil {
			return err
		}
		var pr peer.Peer
		err = call(ctx, addr, cc, grpc.Peer(&pr))
		if err == nil {
			return nil
		}
		if c.isClosed() {
			return ErrClosed
		}
		st := status.Convert(err)
		if ctxErr := ctxDone(ctx); ctxErr != nil {
			// A try cut short by ctx says less than why the tries
			// before it failed.
			if last != nil && cutShort(st.Code()) {
				return giveUp(last, "gave up retrying: "+ctxErr.Error(), ctxErr)
			}
			return fromStatus(err)
		}
		if st.Code() != codes.Unavailable {
			return fromStatus(err)
		}
		leader, refused := notLeader(st)
		// The peer is only known once the call got onto a connection.
		if !idempotent && !refused && pr.Addr != nil {
			return notRetried(st)
		}
		if r == toNode && refused {
			return fromStatus(err)
		}
		last = st
		now := false
		switch r {
		case toLeader:
			now = c.redirect(addr, leader, &streak)
		case toAny:
			c.failover(addr, "")
		}
		wait, err := pace.next(now, st)
		if err != nil {
			return err
		}
		c.log.Debug("retrying an unavailable broker", "addr", addr, "leader", leader, "wait", wait, "err", st.Message())
		if err := sleep(ctx, wait); err != nil {
			return giveUp(st, "gave up retrying: "+err.Error(), err)
		}
	}
}

// ctxDone is ctx's error once ctx ended or its deadline passed: gRPC
// compares the deadline with the clock, and may fail a call with
// DeadlineExceeded before ctx's own timer has fired.
func ctxDone(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

// cutShort reports whether code is what a call cut short by its context, or
// by a broken connection, ends with.
func cutShort(code codes.Code) bool {
	return code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled
}

// pick returns the address the next call should use, node when given, and
// its connection.
func (c *Conn) pick(node string) (string, *grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", nil, ErrClosed
	}
	addr := c.target
	if node != "" {
		addr = node
	}
	cc, err := c.connLocked(addr)
	if err != nil {
		return "", nil, err
	}
	return addr, cc, nil
}

// connLocked returns the connection to addr, creating it if need be. c.mu
// is held, or c is not shared yet.
func (c *Conn) connLocked(addr string) (*grpc.ClientConn, error) {
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, c.dialOptions...)
	if err != nil {
		return nil, fmt.Errorf("txmq: client for %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

// redirect moves the target after addr answered Unavailable naming leader
// ("" if none): to the leader, unless the call already followed
// maxRedirects in a row, else to the next configured address. It reports
// whether to go on at once: going straight to a newly named leader costs
// nothing, while backing off on the next redirect keeps two nodes with stale
// views from bouncing a call in a tight loop.
func (c *Conn) redirect(addr, leader string, streak *int) (now bool) {
	if leader != "" && leader != addr && *streak < maxRedirects {
		*streak++
		c.failover(addr, leader)
		return *streak == 1
	}
	*streak = 0
	c.failover(addr, "")
	return false
}

// failover moves the target away from addr: to leader when given, else to
// the next configured address other than addr. When concurrent calls fail
// on the same address only the first moves the target, so they do not skip
// addresses.
func (c *Conn) failover(addr, leader string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.target != addr {
		return
	}
	if leader != "" {
		c.target = leader
		return
	}
	c.target = c.addrs[c.next]
	c.next = (c.next + 1) % len(c.addrs)
	if c.target == addr && len(c.addrs) > 1 {
		c.target = c.addrs[c.next]
		c.next = (c.next + 1) % len(c.addrs)
	}
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
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
