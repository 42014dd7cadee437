package checkback

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/txmq/txmq/api/checkhttp"
	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// ErrNotReached wraps the error of a check that never got to a producer
// (nothing listening, connection refused, unresolvable host). Such checks
// do not count against max_checks.
var ErrNotReached = errors.New("producer not reached")

// Caller asks a producer endpoint about one half message.
type Caller interface {
	Check(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error)
	Close() error
}

// NetCaller calls producers on their sessions, gRPC endpoints (connections
// cached per address) and HTTP endpoints (JSON POST), at the addresses its
// Guard allows only, following no redirect.
type NetCaller struct {
	guard *Guard
	// dial makes every connection to a producer.
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
	http  *http.Client
	creds credentials.TransportCredentials

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// NewNetCaller returns the caller the broker uses without --callback-ca; a
// nil guard allows DefaultCallbackAllow.
func NewNetCaller(guard *Guard) *NetCaller { return NewTLSCaller(guard, nil) }

// NewTLSCaller returns a caller that calls only what guard allows (nil:
// DefaultCallbackAllow) and whose HTTPS and gRPC calls verify producers
// with conf (--callback-ca), presenting its client certificate when they
// ask for one. With conf set, gRPC endpoints are called over TLS; with
// conf nil, in plaintext.
func NewTLSCaller(guard *Guard, conf *tls.Config) *NetCaller {
	if guard == nil {
		guard, _ = NewGuard(nil)
	}
	c := &NetCaller{guard: guard, dial: guard.dialer().DialContext, creds: insecure.NewCredentials(), conns: map[string]*grpc.ClientConn{}}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return c.dial(ctx, network, addr) },
	}
	c.http = &http.Client{
		Transport:     transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if conf != nil {
		transport.TLSClientConfig = conf
		c.creds = credentials.NewTLS(conf)
	}
	return c
}

// Check implements Caller.
func (c *NetCaller) Check(ctx context.Context, ep Endpoint, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	if ep.Session != nil {
		return ep.Session.Check(ctx, req)
	}
	if err := c.guard.Check(ep.Host()); err != nil {
		return 0, fmt.Errorf("%w: %s: %w", ErrNotReached, ep, err)
	}
	if ep.GRPC != "" {
		return c.checkGRPC(ctx, ep.GRPC, req)
	}
	return c.checkHTTP(ctx, ep.HTTP, req)
}

func (c *NetCaller) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(c.creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) { return c.dial(ctx, "tcp", addr) }),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(checkhttp.MaxAnswerSize)))
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

func (c *NetCaller) checkGRPC(ctx context.Context, addr string, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrNotReached, addr, err)
	}
	resp, err := txmqv1.NewTransactionCheckerClient(cc).CheckTransaction(ctx, req)
	if err != nil {
		if status.Code(err) == codes.Unavailable {
			return 0, fmt.Errorf("%w: %s: %v", ErrNotReached, addr, status.Convert(err).Message())
		}
		return 0, fmt.Errorf("%s: %v", addr, err)
	}
	return resp.Resolution, nil
}

func (c *NetCaller) checkHTTP(ctx context.Context, url string, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	body, err := checkhttp.EncodeRequest(req)
	if err != nil {
		return 0, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	hreq.Header.Set("Content-Type", checkhttp.ContentType)
	resp, err := c.http.Do(hreq)
	if err != nil {
		var op *net.OpError
		if (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, ErrRefused) {
			return 0, fmt.Errorf("%w: %s: %v", ErrNotReached, url, err)
		}
		return 0, fmt.Errorf("%s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return 0, fmt.Errorf("%w: %s: redirect to %q not followed", ErrNotReached, url, resp.Header.Get("Location"))
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, checkhttp.MaxAnswerSize))
	if err != nil {
		return 0, fmt.Errorf("%s: %v", url, err)
	}
	res, err := checkhttp.DecodeAnswer(resp.StatusCode, raw)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", url, err)
	}
	return res, nil
}

// Close closes the cached gRPC connections.
func (c *NetCaller) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for addr, cc := range c.conns {
		errs = append(errs, cc.Close())
		delete(c.conns, addr)
	}
	c.http.CloseIdleConnections()
	return errors.Join(errs...)
}
