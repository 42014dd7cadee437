package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// maxRedirects bounds how many NotLeader answers one call follows, so that
// nodes with stale views of the leader cannot bounce it between them
// forever.
const maxRedirects = 3

// route says which nodes a call may go to, and in which order.
type route int

const (
	// toLeader tries the first address; on Unavailable it follows the
	// leader address of a NotLeader detail, and otherwise tries the next
	// address of --addr.
	toLeader route = iota
	// toLeaderOnce is toLeader for a request that must not run twice (a
	// Send without key, a leadership transfer): after an Unavailable from a
	// node that got the request and did not refuse it as a follower, the
	// request may have taken effect, so it is not sent elsewhere.
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

// conn returns the connection to addr, creating it on first use. gRPC
// connects on the first call, not here.
func (c *cli) conn(addr string) (*grpc.ClientConn, error) {
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	// A node that does not answer at all (a host that is down drops the
	// connection attempt) must leave time to try the other addresses
	// within --timeout.
	connectTimeout := c.timeout / time.Duration(len(c.addrs))
	cc, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvSize)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
			MinConnectTimeout: connectTimeout,
		}))
	if err != nil {
		return nil, fmt.Errorf("--addr %q: %w", addr, err)
	}
	if c.conns == nil {
		c.conns = map[string]*grpc.ClientConn{}
	}
	c.conns[addr] = cc
	return cc, nil
}

// closeConns closes every connection opened.
func (c *cli) closeConns() {
	for addr, cc := range c.conns {
		cc.Close()
		delete(c.conns, addr)
	}
}

// attempt is one try of a call on the connection cc to the node at addr;
// it passes opts on to the RPC.
type attempt func(ctx context.Context, addr string, cc *grpc.ClientConn, opts ...grpc.CallOption) error

// invoke runs call on the nodes r names, one after another, until one
// answers something other than Unavailable, and returns that answer: nil
// for a success, else the error. When every node was tried it returns the
// last Unavailable. ctx bounds it all.
//
// A NotLeader detail in prev, an Unavailable that ended an earlier call (a
// consume stream), names the node to try first.
func (c *cli) invoke(ctx context.Context, r route, prev error, call attempt) error {
	follow := r == toLeader || r == toLeaderOnce
	tried := map[string]bool{}
	next := 0 // index in c.addrs of the next address to try
	target := ""
	if leader, _ := notLeader(prev); follow && leader != "" {
		target = leader
	}
	redirects := 0
	var err error
	for {
		if target == "" {
			for next < len(c.addrs) && tried[c.addrs[next]] {
				next++
			}
			if next == len(c.addrs) {
				return err
			}
			target = c.addrs[next]
			next++
		}
		tried[target] = true
		cc, cerr := c.conn(target)
		if cerr != nil {
			return status.Error(codes.InvalidArgument, cerr.Error())
		}
		var p peer.Peer
		err = call(ctx, target, cc, grpc.Peer(&p))
		if err == nil || status.Code(err) != codes.Unavailable || ctx.Err() != nil || r == toFirst {
			return err
		}
		leader, refused := notLeader(err)
		if follow && leader != "" && leader != target && redirects < maxRedirects {
			redirects++
			target = leader
			continue
		}
		// The peer is known once the request went out on a connection.
		if r == toLeaderOnce && !refused && p.Addr != nil {
			st := status.Convert(err)
			return status.Errorf(st.Code(), "%s (not retried on another node: the request may have taken effect)", st.Message())
		}
		target = ""
	}
}

// notLeader reports whether err is a node's answer that it is not the
// leader, and the leader's gRPC address when it knows one.
func notLeader(err error) (leader string, ok bool) {
	if err == nil {
		return "", false
	}
	for _, d := range status.Convert(err).Details() {
		if nl, isNL := d.(*txmqv1.NotLeader); isNL {
			return nl.GetLeaderAddress(), true
		}
	}
	return "", false
}

// unary makes one call to the broker on the nodes r names, bounded by
// --timeout. newClient and method name the RPC.
func unary[Client, Req, Resp any](ctx context.Context, c *cli, r route,
	newClient func(grpc.ClientConnInterface) Client,
	method func(Client, context.Context, Req, ...grpc.CallOption) (Resp, error),
	req Req,
) (Resp, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var resp Resp
	err := c.invoke(ctx, r, nil, func(ctx context.Context, _ string, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
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
