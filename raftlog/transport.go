package raftlog

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// The TCP transport's stream layer and hashicorp/raft's logging.

// streamLayer is what the transport listens and dials with: cfg.StreamLayer
// when set, else TCP on cfg.Listener or on a listener opened on
// cfg.RaftAddr; under mutual TLS when cfg.PeerTLS is set.
func streamLayer(cfg Config, logger *slog.Logger) (raft.StreamLayer, error) {
	layer, err := plainLayer(cfg)
	if err != nil || cfg.PeerTLS == nil {
		return layer, err
	}
	return newTLSLayer(layer, cfg.PeerTLS, logger), nil
}

func plainLayer(cfg Config) (raft.StreamLayer, error) {
	if cfg.StreamLayer != nil {
		return cfg.StreamLayer, nil
	}
	ln := cfg.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", cfg.RaftAddr); err != nil {
			return nil, fmt.Errorf("raftlog: listen %s: %w", cfg.RaftAddr, err)
		}
	}
	advertise := cfg.AdvertiseAddr
	if advertise == "" {
		advertise = ln.Addr().String()
	}
	adv, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("raftlog: advertise address %q: %w", advertise, err)
	}
	return &tcpLayer{Listener: ln, advertise: adv}, nil
}

// newTransport is the Raft transport over layer. It keeps one append in
// flight per follower, without pipelining: hashicorp/raft's pipeline
// deadlocks when a follower refuses an append while the next is being sent
// (its decoder stops, the sender waits on a channel nobody reads), which
// ends replication to that follower and hangs Shutdown
// (docs/decisions.md).
func newTransport(layer raft.StreamLayer, logger hclog.Logger) *raft.NetworkTransport {
	return raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: layer, MaxPool: 5, Timeout: 10 * time.Second, Logger: logger, MaxRPCsInFlight: 1,
	})
}

// tcpLayer is raft's StreamLayer over a listener we opened ourselves (or
// were handed), so that ":0" works and the advertised address can differ
// from the bound one.
type tcpLayer struct {
	net.Listener
	advertise net.Addr
}

func (t *tcpLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", string(addr), timeout)
}

func (t *tcpLayer) Addr() net.Addr { return t.advertise }

// newHCLogger routes hashicorp/raft's logging into slog, at warn and above
// unless the slog handler asks for debug.
func newHCLogger(l *slog.Logger) hclog.Logger {
	level := hclog.Warn
	if l.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{
		Name:        "raft",
		Level:       level,
		Output:      slogWriter{l},
		DisableTime: true,
	})
}

// slogWriter turns each line hclog writes ("[WARN]  raft: text: k=v") into
// one slog record at the same level.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for prefix, lv := range map[string]slog.Level{
		"[TRACE]": slog.LevelDebug, "[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo,
		"[WARN]": slog.LevelWarn, "[ERROR]": slog.LevelError,
	} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			level, msg = lv, strings.TrimSpace(rest)
			break
		}
	}
	msg = strings.TrimPrefix(msg, "raft: ")
	w.l.Log(context.Background(), level, msg)
	return len(p), nil
}

var _ io.Writer = slogWriter{}
