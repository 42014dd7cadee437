package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
)

// route says which nodes a call may go to, and whether it is safe to send
// it again. Every route retries Unavailable answers with backoff until
// --timeout, by the Go client's rule (txmq.Conn).
type route int

const (
	// toLeader goes to the leader, following NotLeader answers and trying
	// the addresses of --addr in turn, for a request that is safe to
	// repeat: a read, a write with a transaction ID or a key, a commit or
	// rollback, an idempotent admin call.
	toLeader route = iota
	// toLeaderOnce is toLeader for a request that must not run twice (a
	// Send without key, a leadership transfer): after an Unavailable from a
	// node that got the request and did not refuse it as a follower, the
	// request may have taken effect, so it is not sent again.
	toLeaderOnce
	// toAny goes to the first address that answers, without following
	// NotLeader: for reads every node answers, such as ClusterStatus.
	toAny
	// toFirst goes to the first address of --addr only: for what is per
	// node, such as TakeSnapshot.
	toFirst
)

// parseAddrs splits the --addr list. Duplicates count once.
func parseAddrs(list string) ([]string, error) {
	var addrs []string
	for a := range strings.SplitSeq(list, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("--addr %q has an empty address", list)
		}
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return addrs, nil
}

// dial prepares the connection to the nodes of --addr. It does not
// connect: the first call to each node does.
func (c *cli) dial() error {
	// A node that does not answer at all (a host that is down drops the
	// connection attempt) must leave time to try the other addresses
	// within --timeout.
	connectTimeout := c.timeout / time.Duration(len(c.addrs))
	conf, err := c.tls.config()
	if err != nil {
		return err
	}
	conn, err := txmq.Dial(txmq.ConnConfig{
		Addrs: c.addrs,
		TLS:   conf,
		DialOptions: []grpc.DialOption{
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
				MinConnectTimeout: connectTimeout,
			}),
		},
		// brokerctl reports the outcome of each call, not its retries.
		Logger:       slog.New(slog.DiscardHandler),
		RetryTimeout: c.timeout,
		Token:        c.token,
	})
	if err != nil {
		return fmt.Errorf("--addr %q: %w", c.addr, err)
	}
	c.conn = conn
	return nil
}

// invoke runs call on the nodes r names, bounded by ctx: see route.
func (c *cli) invoke(ctx context.Context, r route, call txmq.Call) error {
	switch r {
	case toAny:
		return c.conn.InvokeAny(ctx, call)
	case toFirst:
		return c.conn.InvokeOn(ctx, c.addrs[0], call)
	default:
		return c.conn.Invoke(ctx, r == toLeader, call)
	}
}

// unary makes one call to the broker on the nodes r names, its retries
// bounded by --timeout. newClient and method name the RPC.
func unary[Client, Req, Resp any](ctx context.Context, c *cli, r route,
	newClient func(grpc.ClientConnInterface) Client,
	method func(Client, context.Context, Req, ...grpc.CallOption) (Resp, error),
	req Req,
) (Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var resp Resp
	err := c.invoke(ctx, r, func(ctx context.Context, _ string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		var err error
		resp, err = method(newClient(cc), ctx, req, opts...)
		return err
	})
	return resp, err
}

// adminCall is unary for an AdminService RPC, named by its method
// expression, such as txmqv1.AdminServiceClient.ListTopics.
func adminCall[Req, Resp any](ctx context.Context, c *cli, r route,
	method func(txmqv1.AdminServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
	req Req,
) (Resp, error) {
	return unary(ctx, c, r, txmqv1.NewAdminServiceClient, method, req)
}

// producerCall is unary for a ProducerService RPC.
func producerCall[Req, Resp any](ctx context.Context, c *cli, r route,
	method func(txmqv1.ProducerServiceClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
	req Req,
) (Resp, error) {
	return unary(ctx, c, r, txmqv1.NewProducerServiceClient, method, req)
}

// checkHostPort accepts host:port with a port.
func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	switch {
	case err != nil:
		return err
	case host == "" || port == "":
		return errors.New("want host:port")
	}
	return nil
}
