package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/txmq/txmq/broker"
)

// authFlags are the flags of authentication, authorization, limits and
// the callback allowlist (docs/security.md).
type authFlags struct {
	file, callbackAllow, peerToken *string
	requests, bytes                *float64
	streams, conns, instances      *int
}

func newAuthFlags(fs *flag.FlagSet) *authFlags {
	return &authFlags{
		file:          fs.String("auth-file", "", "YAML file of principals, groups and rules (docs/security.md); reloaded on SIGHUP; empty turns auth off"),
		peerToken:     fs.String("peer-token", "", "token this node presents to the other members when they have an auth file (to join, and for cluster status); its principal needs admin:read and admin:write on cluster (env TXMQ_PEER_TOKEN)"),
		callbackAllow: fs.String("callback-allow", "", "comma-separated hosts, *.domains, IPs and CIDRs producer callbacks may be at, besides the addresses producers register from (default: loopback only)"),
		requests:      fs.Float64("principal-requests", broker.DefaultPrincipalRequests, "requests per second one principal may make (auth on)"),
		bytes:         fs.Float64("principal-bytes", broker.DefaultPrincipalBytes, "request bytes per second one principal may send (auth on)"),
		streams:       fs.Int("principal-streams", broker.DefaultPrincipalStreams, "streams (sessions, subscriptions) one principal may have open (auth on)"),
		conns:         fs.Int("principal-conns", broker.DefaultPrincipalConns, "connections one principal may have open, counting those it has made a call on (auth on)"),
		instances:     fs.Int("max-instances-per-group", broker.DefaultGroupInstances, "producer instances registered for check-backs per producer group"),
	}
}

// apply sets the broker's configuration from the flags.
func (f *authFlags) apply(cfg *broker.Config) {
	cfg.AuthFile = *f.file
	cfg.PeerToken = *f.peerToken
	if *f.callbackAllow != "" {
		cfg.CallbackAllow = strings.Split(*f.callbackAllow, ",")
	}
	cfg.Limits = broker.Limits{Requests: *f.requests, Bytes: *f.bytes, Streams: *f.streams, Conns: *f.conns, Instances: *f.instances}
}

// reloadOnHUP reloads the auth file on every SIGHUP until ctx ends; a
// file that does not load keeps the rules in force (the broker logs why).
func reloadOnHUP(ctx context.Context, b *broker.Broker) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			_ = b.ReloadAuth()
		}
	}
}
