// Package window is the flow control of txmq's gRPC API, the same on both
// ends (the broker's server, the Go client's connections): static windows
// of Stream bytes per stream and Conn per connection.
//
// gRPC's default is a 64 KiB window that a bandwidth-delay estimator grows:
// the receiver of data pings the sender and times the answer. With a
// producer's small requests and answers a few hundred microseconds apart,
// nearly every message starts such a ping, so a call cost the client 15–18
// system calls per transaction and the leader 19–23; with static windows,
// 10 and 16 (docs/decisions.md › Static flow-control windows). Conn is the
// most the estimator would ever grow a window to (16 MiB), and Stream is the
// default limit of a message body (4 MiB), so a largest message needs
// only one window update on its way.
package window

import "google.golang.org/grpc"

const (
	// Stream is each stream's window, in bytes.
	Stream = 4 << 20
	// Conn is each connection's window, in bytes.
	Conn = 16 << 20
)

// ServerOptions are the windows of a gRPC server of the API.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(Stream), grpc.StaticConnWindowSize(Conn)}
}

// DialOptions are the windows of a client connection to the API.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithStaticStreamWindowSize(Stream), grpc.WithStaticConnWindowSize(Conn)}
}
