package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/rocketmq"
)

// open checks the flags and opens the --rocketmq-listen port; nil when it
// is off. The remoting protocol has no TLS and txmq no RocketMQ ACL: off
// loopback it takes --insecure, and a broker with an auth file refuses it.
func (f *rocketmqFlags) open(auth, insecure bool) (net.Listener, error) {
	addr := *f.listen
	if addr == "" {
		return nil, nil
	}
	if auth {
		return nil, fmt.Errorf("--rocketmq-listen with --auth-file: the RocketMQ protocol has no authentication here, so it would let anyone past the auth file (docs/rocketmq.md)")
	}
	if _, err := rocketmqPeers(*f.peers); err != nil {
		return nil, err
	}
	if !insecure && !loopback.Addr(addr) {
		return nil, fmt.Errorf("--rocketmq-listen: %s is not a loopback address and the RocketMQ protocol has neither TLS nor authentication here: give --insecure to serve it anyway (docs/rocketmq.md)", addr)
	}
	lis, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, fmt.Errorf("--rocketmq-listen: %w", err)
	}
	return lis, nil
}

// rocketmqFlags are the flags of the RocketMQ front end.
type rocketmqFlags struct {
	listen, advertise, peers *string
}

func newRocketMQFlags(fs *flag.FlagSet) *rocketmqFlags {
	return &rocketmqFlags{
		listen:    fs.String("rocketmq-listen", "", "serve the RocketMQ remoting protocol (name server and broker on one port) on this address, for unmodified RocketMQ clients (docs/rocketmq.md); empty (the default) turns it off"),
		advertise: fs.String("rocketmq-advertise", "", "IPv4 address and port RocketMQ clients reach this node's --rocketmq-listen at (default: the bound address)"),
		peers:     fs.String("rocketmq-peers", "", "comma-separated node-id=address of every node's RocketMQ address, so that a follower names the leader in its route answers"),
	}
}

// rocketmqPeers reads --rocketmq-peers (the spelling of --peers).
func rocketmqPeers(s string) (map[string]string, error) {
	list, err := parsePeers(s)
	if err != nil {
		return nil, fmt.Errorf("--rocketmq-peers: %w", err)
	}
	out := make(map[string]string, len(list))
	for _, p := range list {
		out[p.ID] = p.RaftAddr
	}
	return out, nil
}

// serveRocketMQ starts the RocketMQ front end on lis; nil lis: none.
func serveRocketMQ(lis net.Listener, f *rocketmqFlags, b *broker.Broker, logger *slog.Logger) (*rocketmq.Server, error) {
	if lis == nil {
		return nil, nil
	}
	peers, err := rocketmqPeers(*f.peers)
	if err != nil {
		return nil, err
	}
	return rocketmq.Serve(lis, rocketmq.Config{Broker: b, Logger: logger, Advertise: *f.advertise, Peers: peers})
}
