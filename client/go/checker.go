package txmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/txmq/txmq/api/checkhttp"
	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

const (
	defaultCallbackListen    = "127.0.0.1:0"
	defaultHeartbeatInterval = 3 * time.Second
	// minHeartbeatTimeout keeps a very short heartbeat interval from cutting
	// every heartbeat call short.
	minHeartbeatTimeout = time.Second
	// callbackDrainTimeout bounds how long Close waits for check-backs in
	// progress before it cancels them.
	callbackDrainTimeout = 5 * time.Second
)

// Resolution is a Checker's answer: what became of the local transaction
// behind a half message.
type Resolution int

const (
	// Unknown: the outcome is not known yet, e.g. the local transaction may
	// still be running. The broker asks again later, with backoff, until the
	// message's checks are used up or it is too old; then it expires.
	Unknown Resolution = iota
	// Commit: the local transaction committed. The broker commits the half
	// message and delivers it.
	Commit
	// Rollback: the local transaction rolled back, or never ran and never
	// can. The broker discards the half message.
	Rollback
)

func (r Resolution) String() string {
	switch r {
	case Unknown:
		return "unknown"
	case Commit:
		return "commit"
	case Rollback:
		return "rollback"
	}
	return fmt.Sprintf("Resolution(%d)", int(r))
}

func (r Resolution) proto() txmqv1.Resolution {
	switch r {
	case Commit:
		return txmqv1.Resolution_RESOLUTION_COMMIT
	case Rollback:
		return txmqv1.Resolution_RESOLUTION_ROLLBACK
	}
	return txmqv1.Resolution_RESOLUTION_UNKNOWN
}

// HalfMessage is the half message a check-back asks about.
type HalfMessage struct {
	MessageID     string
	Topic         string
	ProducerGroup string
	// TransactionID is the ID the producer sent the half message under: the
	// key to look the local transaction up by.
	TransactionID string
	Key           string
	// Properties and Body belong to the Checker.
	Properties map[string]string
	Body       []byte
	// Attempt is 1 on the first check-back of the message, then 2, 3, ...
	Attempt uint32
	// CreatedAt is when the broker's leader stored the half message, by the
	// leader's clock.
	CreatedAt time.Time
}

// halfMessage is the half message a check-back, by gRPC or HTTP, asks about.
func halfMessage(req *txmqv1.CheckTransactionRequest) HalfMessage {
	m := HalfMessage{
		MessageID:     req.GetMessageId(),
		Topic:         req.GetTopic(),
		ProducerGroup: req.GetProducerGroup(),
		TransactionID: req.GetTransactionId(),
		Key:           req.GetKey(),
		Properties:    req.GetProperties(),
		Body:          req.GetBody(),
		Attempt:       req.GetAttempt(),
	}
	if ts := req.GetCreatedAt(); ts != nil {
		m.CreatedAt = ts.AsTime()
	}
	return m
}

// Checker answers a check-back: did the local transaction behind m commit?
// The broker calls it, through the producer, when a half message stayed
// pending past its check-after time, typically because the producer died
// between its local commit and Commit.
//
// The answer must come from the database the local transaction wrote, read
// after that transaction's commit, on the primary: never from a cache, a
// Redis flag, a read replica that may lag, or a flag written before the
// local transaction committed. Such a copy can say "committed" for a
// transaction that rolled back, and the broker then delivers a message for
// something that never happened. (This is how an order service once handed
// out loyalty points for orders that did not exist: its check-back read a
// cache flag set right after SendHalf, and the rollback never cleared it.)
//
// The pattern that works is a transaction-log table in the business
// database. The local transaction inserts a row (tx_id PRIMARY KEY, status)
// in the same database transaction as its business change, so the row exists
// exactly when the change committed. The Checker then runs
//
//	SELECT 1 FROM tx_log WHERE tx_id = ?
//
// and answers
//   - Commit when the row is there;
//   - Rollback when it is not and the half message is older than the
//     longest the local transaction can take (bound the local transaction
//     with a timeout, and leave a margin for clock skew): e.g.
//     m.CreatedAt + 1 min < now;
//   - Unknown otherwise: the local transaction may still commit.
//
// A late local transaction that outlives its bound could still commit after
// a Rollback answer. To rule that out, the Checker can insert the row itself
// with status 'rolled_back' before it answers Rollback: the primary key then
// makes the late local transaction fail. The Checker must then answer from
// the row's status (SELECT status ...), not from its mere presence. See
// ExampleChecker.
//
// Returning an error counts like Unknown: the broker asks again later. A
// panic is recovered and reported as an error. ctx ends when the broker's
// call does. A Checker must be safe for concurrent use: check-backs of
// different messages, and a repeat of a check that timed out, may overlap.
type Checker func(ctx context.Context, m HalfMessage) (Resolution, error)

// panicError is a Checker's panic turned into an error.
type panicError struct{ v any }

func (e *panicError) Error() string { return fmt.Sprintf("txmq: checker panicked: %v", e.v) }

// runChecker calls c, turning a panic and an out-of-range answer into errors.
func runChecker(ctx context.Context, c Checker, m HalfMessage, log *slog.Logger) (res Resolution, err error) {
	defer func() {
		if v := recover(); v != nil {
			log.Error("checker panicked", "msg_id", m.MessageID, "tx_id", m.TransactionID,
				"panic", v, "stack", string(debug.Stack()))
			res, err = Unknown, &panicError{v: v}
		}
	}()
	res, err = c(ctx, m)
	if err != nil {
		return Unknown, err
	}
	if res != Unknown && res != Commit && res != Rollback {
		return Unknown, fmt.Errorf("txmq: checker returned %v, which is not Unknown, Commit or Rollback", res)
	}
	return res, nil
}

// checkServer serves txmqv1.TransactionChecker for one producer group.
type checkServer struct {
	txmqv1.UnimplementedTransactionCheckerServer
	group   string
	checker Checker
	log     *slog.Logger
}

func (s *checkServer) CheckTransaction(ctx context.Context, req *txmqv1.CheckTransactionRequest) (*txmqv1.CheckTransactionResponse, error) {
	// The address of a dead instance may be reused by an instance of another
	// group; its database knows nothing of this transaction and would answer
	// Rollback for a committed one.
	if g := req.GetProducerGroup(); g != s.group {
		return nil, status.Errorf(codes.FailedPrecondition,
			"this instance serves producer group %q, not %q", s.group, g)
	}
	if req.GetTransactionId() == "" {
		return nil, status.Error(codes.InvalidArgument, "transaction_id is empty")
	}
	m := halfMessage(req)
	log := s.log.With("msg_id", m.MessageID, "tx_id", m.TransactionID, "attempt", m.Attempt)
	res, err := runChecker(ctx, s.checker, m, log)
	if err != nil {
		log.Warn("check-back failed; the broker will ask again", "err", err)
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		code := codes.Unknown
		if _, ok := errors.AsType[*panicError](err); ok {
			code = codes.Internal
		}
		return nil, status.Error(code, err.Error())
	}
	log.Info("check-back answered", "resolution", res)
	return &txmqv1.CheckTransactionResponse{Resolution: res.proto()}, nil
}

// callback is a producer's side of check-backs: the server that answers
// them (none when the user serves CheckHandler at CallbackURL) and the loop
// that keeps the instance registered with the broker.
type callback struct {
	group        string
	instance     string
	endpoint     *txmqv1.CallbackEndpoint
	addr         string // what the broker is told: host:port or URL
	retryTimeout time.Duration
	conn         *Conn
	log          *slog.Logger

	srv    *grpc.Server
	served chan struct{} // closed when srv.Serve returned

	cancel   context.CancelFunc
	loopDone chan struct{}
}

// callbackConfig checks the check-back fields of cfg and fills in their
// defaults. It runs before anything is started.
func callbackConfig(cfg *ProducerConfig) error {
	if cfg.InstanceID == "" {
		cfg.InstanceID = defaultInstanceID()
	} else if err := checkName("InstanceID", cfg.InstanceID); err != nil {
		return err
	}
	if cfg.Checker == nil {
		for _, f := range []struct{ name, value string }{
			{"CallbackListen", cfg.CallbackListen},
			{"CallbackAdvertise", cfg.CallbackAdvertise},
			{"CallbackURL", cfg.CallbackURL},
		} {
			if f.value != "" {
				return invalidf("%s is set but Checker is nil", f.name)
			}
		}
		return nil
	}
	if cfg.ProducerGroup == "" {
		return invalidf("ProducerGroup is not set; a Checker answers for a producer group")
	}
	if cfg.CallbackURL != "" {
		if cfg.CallbackListen != "" || cfg.CallbackAdvertise != "" {
			return invalidf("CallbackURL excludes CallbackListen and CallbackAdvertise")
		}
		u, err := url.Parse(cfg.CallbackURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return invalidf("CallbackURL %q is not an absolute http:// or https:// URL", cfg.CallbackURL)
		}
		return nil
	}
	if cfg.CallbackListen == "" {
		cfg.CallbackListen = defaultCallbackListen
	}
	if a := cfg.CallbackAdvertise; a != "" {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" || port == "0" {
			return invalidf("CallbackAdvertise %q is not a host:port the broker can dial", a)
		}
	}
	return nil
}

var notInName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// defaultInstanceID is hostname-pid-random: readable in the broker's
// listings, and unique even for two producers in one process.
func defaultInstanceID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "producer"
	}
	host = strings.Trim(notInName.ReplaceAllString(host, "-"), "-")
	if len(host) > 64 {
		host = host[:64]
	}
	if host == "" {
		host = "producer"
	}
	return fmt.Sprintf("%s-%d-%08x", host, os.Getpid(), rand.Uint32())
}

// startCallback starts the check-back server (unless cfg.CallbackURL is
// set), registers the instance, and starts the heartbeat loop. It fails
// only when the server cannot listen, the broker refuses the registration
// as invalid, or ctx is cancelled; a broker it cannot reach is retried in
// the background.
func startCallback(ctx context.Context, cfg ProducerConfig, conn *Conn, log *slog.Logger) (*callback, error) {
	c := &callback{
		group:        cfg.ProducerGroup,
		instance:     cfg.InstanceID,
		retryTimeout: cfg.RetryTimeout,
		conn:         conn,
		log:          log,
		loopDone:     make(chan struct{}),
	}
	if cfg.CallbackURL != "" {
		c.addr = cfg.CallbackURL
		c.endpoint = &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: cfg.CallbackURL}}
	} else {
		lis, err := net.Listen("tcp", cfg.CallbackListen)
		if err != nil {
			return nil, fmt.Errorf("txmq: listen for check-backs on CallbackListen %q: %w", cfg.CallbackListen, err)
		}
		c.addr = cfg.CallbackAdvertise
		if c.addr == "" {
			c.addr = advertiseAddr(lis.Addr(), log)
		}
		c.endpoint = &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: c.addr}}
		c.srv = grpc.NewServer(grpc.MaxRecvMsgSize(checkhttp.MaxRequestSize))
		txmqv1.RegisterTransactionCheckerServer(c.srv, &checkServer{group: cfg.ProducerGroup, checker: cfg.Checker, log: log})
		c.served = make(chan struct{})
		go func() {
			defer close(c.served)
			_ = c.srv.Serve(lis)
		}()
	}

	// One bounded try now, so that in the usual case check-backs can reach
	// the producer as soon as NewProducer returns.
	try, cancel := context.WithTimeout(ctx, c.retryTimeout)
	interval, err := c.register(try)
	cancel()
	registered := err == nil
	if err != nil {
		if errors.Is(err, ErrInvalidArgument) || errors.Is(ctx.Err(), context.Canceled) {
			c.stopServer()
			return nil, err
		}
		log.Warn("cannot register for check-backs yet; retrying in the background", "err", err)
	}

	ctx, c.cancel = context.WithCancel(context.Background())
	go c.loop(ctx, registered, interval)
	return c, nil
}

// advertiseAddr is the bound address, with the host name in place of a
// wildcard IP, which no broker could dial.
func advertiseAddr(a net.Addr, log *slog.Logger) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return a.String()
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "localhost"
	}
	addr := net.JoinHostPort(host, fmt.Sprint(tcp.Port))
	log.Info("check-back server listens on all interfaces; advertising the host name (set CallbackAdvertise to override)",
		"listen", a.String(), "advertise", addr)
	return addr
}

// register announces the instance and returns the heartbeat interval the
// broker asked for.
func (c *callback) register(ctx context.Context) (time.Duration, error) {
	req := &txmqv1.RegisterProducerRequest{ProducerGroup: c.group, InstanceId: c.instance, Endpoint: c.endpoint}
	var resp *txmqv1.RegisterProducerResponse
	err := c.conn.Invoke(ctx, true, func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		resp, err = txmqv1.NewProducerServiceClient(cc).RegisterProducer(ctx, req, opts...)
		return err
	})
	if err != nil {
		return defaultHeartbeatInterval, fmt.Errorf("txmq: register producer instance %s: %w", c.instance, err)
	}
	interval := resp.GetHeartbeatInterval().AsDuration()
	if interval <= 0 {
		interval = defaultHeartbeatInterval
	}
	lease := resp.GetLease().AsDuration()
	if lease > 0 && interval >= lease {
		c.log.Warn("heartbeat interval is not shorter than the lease; heartbeating at a third of the lease",
			"heartbeat_interval", interval, "lease", lease)
		interval = lease / 3
	}
	c.log.Info("registered for check-backs", "endpoint", c.addr, "heartbeat_interval", interval, "lease", lease)
	return interval, nil
}

func (c *callback) heartbeat(ctx context.Context, interval time.Duration) error {
	bound := max(interval, minHeartbeatTimeout)
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	req := &txmqv1.HeartbeatRequest{ProducerGroup: c.group, InstanceId: c.instance}
	var resp *txmqv1.HeartbeatResponse
	err := c.conn.Invoke(ctx, true, func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		resp, err = txmqv1.NewProducerServiceClient(cc).Heartbeat(ctx, req, opts...)
		return err
	})
	if err != nil {
		return err
	}
	c.log.Debug("heartbeat", "lease_expires_at", resp.GetLeaseExpiresAt().AsTime())
	return nil
}

// loop keeps the instance registered until ctx ends: a heartbeat every
// interval, and a new registration whenever the broker no longer knows the
// instance (a new leader, an expired lease) or the last one failed.
// Unavailable brokers and leader changes are handled by the Conn's retries.
func (c *callback) loop(ctx context.Context, registered bool, interval time.Duration) {
	defer close(c.loopDone)
	retry := retryBaseDelay
	wait := interval
	if !registered {
		wait = retry
	}
	for {
		if sleep(ctx, wait) != nil {
			return
		}
		if !registered {
			rctx, cancel := context.WithTimeout(ctx, c.retryTimeout)
			iv, err := c.register(rctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				wait = retry/2 + rand.N(retry/2+1)
				retry = min(2*retry, interval)
				c.log.Warn("registration for check-backs failed; retrying", "err", err, "retry_in", wait)
				continue
			}
			registered, interval, retry, wait = true, iv, retryBaseDelay, iv
			continue
		}
		err := c.heartbeat(ctx, interval)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil:
			wait = interval
		case errors.Is(err, ErrNotFound):
			c.log.Info("the broker does not know this instance (new leader or expired lease); registering again", "err", err)
			registered, wait = false, 0
		default:
			c.log.Warn("heartbeat failed", "err", err)
			wait = interval
		}
	}
}

// close stops the heartbeats, then the server: check-backs in progress get
// callbackDrainTimeout to finish before their contexts are cancelled.
func (c *callback) close() {
	c.cancel()
	<-c.loopDone
	c.stopServer()
}

func (c *callback) stopServer() {
	if c.srv == nil {
		return
	}
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		c.srv.GracefulStop()
	}()
	t := time.NewTimer(callbackDrainTimeout)
	defer t.Stop()
	select {
	case <-stopped:
	case <-t.C:
		c.log.Warn("check-backs still running after the drain timeout; cancelling them", "timeout", callbackDrainTimeout)
		c.srv.Stop()
		<-stopped
	}
	<-c.served
}
