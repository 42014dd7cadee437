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
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/txmq/txmq/api/checkhttp"
	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// The registration of a producer instance for check-backs: where they come
// (the producer's session, a check-back server, or CallbackURL) and the
// loop that keeps the instance registered.

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

// callback is a producer's side of check-backs: by default the producer's
// session, which carries them (checker_session.go); else the server that
// answers them (none when the user serves CheckHandler at CallbackURL). And
// the loop that keeps the instance registered with the broker.
type callback struct {
	group        string
	instance     string
	checker      Checker
	retryTimeout time.Duration
	conn         *Conn
	log          *slog.Logger

	// The session's side; viaSession and stream belong to the loop.
	viaSession   bool
	pipe         *pipeline
	stream       *sessionStream // the session the instance registered on
	checksMu     sync.Mutex
	checksClosed bool
	checks       sync.WaitGroup // check-backs being answered on sessions
	checksCtx    context.Context
	stopChecks   context.CancelFunc

	// The server's side, or CallbackURL's.
	listen, advertise string
	endpoint          *txmqv1.CallbackEndpoint
	mu                sync.Mutex
	addr              string // what the broker is told: host:port or URL
	srv               *grpc.Server
	served            chan struct{} // closed when srv.Serve returned

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

// startCallback registers the instance for check-backs, on the producer's
// session (pipe) unless cfg asks for a server or a URL, and starts the
// heartbeat loop. It fails only when the server cannot listen, the broker
// refuses the registration as invalid, or ctx is cancelled; a broker it
// cannot reach is retried in the background.
func startCallback(ctx context.Context, cfg ProducerConfig, conn *Conn, pipe *pipeline, log *slog.Logger) (*callback, error) {
	c := &callback{
		group:        cfg.ProducerGroup,
		instance:     cfg.InstanceID,
		checker:      cfg.Checker,
		retryTimeout: cfg.RetryTimeout,
		conn:         conn,
		log:          log,
		pipe:         pipe,
		listen:       cfg.CallbackListen,
		advertise:    cfg.CallbackAdvertise,
		loopDone:     make(chan struct{}),
	}
	c.checksCtx, c.stopChecks = context.WithCancel(context.Background())
	switch {
	case cfg.CallbackURL != "":
		c.addr = cfg.CallbackURL
		c.endpoint = &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: cfg.CallbackURL}}
	case c.listen != "" || c.advertise != "":
		if err := c.serve(); err != nil {
			return nil, err
		}
	default:
		c.viaSession = true
		pipe.onCheck = c.answerOn
	}

	// One bounded try now, so that in the usual case check-backs can reach
	// the producer as soon as NewProducer returns.
	try, cancel := context.WithTimeout(ctx, c.retryTimeout)
	interval, err := c.register(try)
	cancel()
	registered := err == nil
	if err != nil {
		if errors.Is(err, ErrInvalidArgument) || errors.Is(ctx.Err(), context.Canceled) {
			c.stopChecks()
			c.stopServer()
			return nil, err
		}
		log.Warn("cannot register for check-backs yet; retrying in the background", "err", err)
	}

	loop, cancelLoop := context.WithCancel(context.Background())
	c.cancel = cancelLoop
	go c.loop(loop, registered, interval)
	return c, nil
}

// serve starts the check-back server on c.listen (default 127.0.0.1:0).
func (c *callback) serve() error {
	if c.listen == "" {
		c.listen = defaultCallbackListen
	}
	lis, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("txmq: listen for check-backs on CallbackListen %q: %w", c.listen, err)
	}
	addr := c.advertise
	if addr == "" {
		addr = advertiseAddr(lis.Addr(), c.log)
	}
	c.mu.Lock()
	c.addr = addr
	c.mu.Unlock()
	c.endpoint = &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: addr}}
	c.srv = grpc.NewServer(grpc.MaxRecvMsgSize(checkhttp.MaxRequestSize))
	txmqv1.RegisterTransactionCheckerServer(c.srv, &checkServer{group: c.group, checker: c.checker, log: c.log})
	c.served = make(chan struct{})
	go func() {
		defer close(c.served)
		_ = c.srv.Serve(lis)
	}()
	return nil
}

// callbackAddr is what the broker was told, "" on the session.
func (c *callback) callbackAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.addr
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

// register announces the instance, on the session or with its endpoint,
// and returns the heartbeat interval the broker asked for. A broker whose
// sessions carry no check-backs gets the check-back server instead.
func (c *callback) register(ctx context.Context) (time.Duration, error) {
	req := &txmqv1.RegisterProducerRequest{ProducerGroup: c.group, InstanceId: c.instance}
	var resp *txmqv1.RegisterProducerResponse
	var err error
	if c.viaSession {
		resp, err = c.registerOnSession(ctx, req)
		if errors.Is(err, errNoSession) {
			c.log.Info("the broker carries no check-backs on producer sessions; serving them on a port of this producer's", "err", err)
			if err = c.serve(); err != nil {
				return defaultHeartbeatInterval, err
			}
			c.viaSession = false
		}
	}
	if !c.viaSession {
		req.Endpoint = c.endpoint
		err = c.conn.Invoke(ctx, true, func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
			var err error
			resp, err = txmqv1.NewProducerServiceClient(cc).RegisterProducer(ctx, req, opts...)
			return err
		})
	}
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
	c.log.Info("registered for check-backs", "endpoint", c.endpointText(), "heartbeat_interval", interval, "lease", lease)
	return interval, nil
}

func (c *callback) heartbeat(ctx context.Context, interval time.Duration) error {
	bound := max(interval, minHeartbeatTimeout)
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	req := &txmqv1.HeartbeatRequest{ProducerGroup: c.group, InstanceId: c.instance}
	var resp *txmqv1.HeartbeatResponse
	var err error
	if c.viaSession {
		var r *txmqv1.SessionResponse
		r, _, err = c.onSession(ctx, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Heartbeat{Heartbeat: req}})
		resp = r.GetHeartbeat()
	} else {
		err = c.conn.Invoke(ctx, true, func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
			var err error
			resp, err = txmqv1.NewProducerServiceClient(cc).Heartbeat(ctx, req, opts...)
			return err
		})
	}
	if err != nil {
		return err
	}
	c.log.Debug("heartbeat", "lease_expires_at", resp.GetLeaseExpiresAt().AsTime())
	return nil
}

// loop keeps the instance registered until ctx ends: a heartbeat every
// interval, and a new registration whenever the broker no longer knows the
// instance (a new leader, an expired lease), the last one failed, or the
// session it was made on ended (at once: the broker forgot the instance
// with it). Unavailable brokers and leader changes are handled by the
// Conn's retries.
func (c *callback) loop(ctx context.Context, registered bool, interval time.Duration) {
	defer close(c.loopDone)
	retry := retryBaseDelay
	wait := interval
	if !registered {
		wait = retry
	}
	for {
		lost, err := c.wait(ctx, wait, registered)
		if err != nil {
			return
		}
		if lost {
			c.log.Info("the session this instance registered on ended; registering again")
			registered = false
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
		err = c.heartbeat(ctx, interval)
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

// close stops the heartbeats, then the server or the session's
// check-backs: check-backs in progress get callbackDrainTimeout to finish
// before their contexts are cancelled.
func (c *callback) close() {
	c.cancel()
	<-c.loopDone
	c.drainChecks()
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
	c.drain(stopped, c.srv.Stop)
	<-c.served
}

// drain waits until done is closed: at most callbackDrainTimeout, then it
// cancels what runs (stop) and waits on.
func (c *callback) drain(done <-chan struct{}, stop func()) {
	t := time.NewTimer(callbackDrainTimeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		c.log.Warn("check-backs still running after the drain timeout; cancelling them", "timeout", callbackDrainTimeout)
		stop()
		<-done
	}
}
