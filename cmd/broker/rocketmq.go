package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/rocketmq"
)

// open checks the flags and opens the --rocketmq-listen port; nil when it
// is off. The remoting protocol has no TLS and txmq no RocketMQ ACL: off
// loopback it takes --insecure, and a broker with an auth file refuses it.
// The address RocketMQ clients reach (--rocketmq-advertise, or the bound
// one) goes into cfg, which announces it with the node's record.
func (f *rocketmqFlags) open(cfg *broker.Config, insecure bool) (net.Listener, error) {
	addr := *f.listen
	if addr == "" {
		return nil, nil
	}
	if cfg.AuthFile != "" {
		return nil, fmt.Errorf("--rocketmq-listen with --auth-file: the RocketMQ protocol has no authentication here, so it would let anyone past the auth file (docs/rocketmq.md)")
	}
	if !insecure && !loopback.Addr(addr) {
		return nil, fmt.Errorf("--rocketmq-listen: %s is not a loopback address and the RocketMQ protocol has neither TLS nor authentication here: give --insecure to serve it anyway (docs/rocketmq.md)", addr)
	}
	if ap, err := netip.ParseAddrPort(addr); err == nil && ap.Addr().IsUnspecified() && *f.advertise == "" {
		return nil, fmt.Errorf("--rocketmq-listen: %s names no address clients can reach: give --rocketmq-advertise, the address other nodes name in their route answers", addr)
	}
	lis, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("--rocketmq-listen: %w", err)
	}
	cfg.RocketMQAdvertise = *f.advertise
	if cfg.RocketMQAdvertise == "" {
		cfg.RocketMQAdvertise = lis.Addr().String()
	}
	return lis, nil
}

// rocketmqFlags are the flags of the RocketMQ front end.
type rocketmqFlags struct {
	listen, advertise *string
}

func newRocketMQFlags(fs *flag.FlagSet) *rocketmqFlags {
	return &rocketmqFlags{
		listen:    fs.String("rocketmq-listen", "", "serve the RocketMQ remoting protocol (name server and broker on one port) on this address, for unmodified RocketMQ clients (docs/rocketmq.md); empty (the default) turns it off"),
		advertise: fs.String("rocketmq-advertise", "", "IPv4 address and port RocketMQ clients reach this node's --rocketmq-listen at (default: the bound address); the node announces it to the cluster, whose followers name the leader's in route answers"),
	}
}

// serveRocketMQ starts the RocketMQ front end on lis; nil lis: none.
func serveRocketMQ(lis net.Listener, b *broker.Broker, logger *slog.Logger) (*rocketmq.Server, error) {
	if lis == nil {
		return nil, nil
	}
	return rocketmq.Serve(lis, rocketmq.Config{Broker: b, Logger: logger, Advertise: b.RocketMQAddr(b.Node().ID())})
}
