package main

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/rocketmq"
)

// listenRocketMQ opens the --rocketmq-listen port. The remoting protocol
// has no TLS and txmq no RocketMQ ACL: off loopback it takes --insecure.
func listenRocketMQ(addr string, insecure bool) (net.Listener, error) {
	if !insecure && !loopback.Addr(addr) {
		return nil, fmt.Errorf("%s is not a loopback address and the RocketMQ protocol has neither TLS nor authentication here: give --insecure to serve it anyway (docs/rocketmq.md)", addr)
	}
	lis, err := net.Listen("tcp4", addr)
	if err != nil {
		return nil, err
	}
	return lis, nil
}

// serveRocketMQ starts the RocketMQ front end on lis; nil lis: none.
func serveRocketMQ(lis net.Listener, b *broker.Broker, logger *slog.Logger) (*rocketmq.Server, error) {
	if lis == nil {
		return nil, nil
	}
	return rocketmq.Serve(lis, rocketmq.Config{Broker: b, Logger: logger})
}
