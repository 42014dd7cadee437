package raftlog

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// handshakeTimeout bounds a TLS handshake on the Raft port, so that a
// client that connects and says nothing holds no goroutine for long.
const handshakeTimeout = 5 * time.Second

// tlsLayer is mutual TLS over another stream layer. Accept hands the
// transport only connections whose handshake completed, so a plaintext
// client or one without a certificate of the cluster's CA is closed
// before the transport reads a byte from it. Handshakes run on their own
// goroutines: a slow one does not hold up the others.
type tlsLayer struct {
	inner raft.StreamLayer
	conf  *tls.Config
	log   *slog.Logger

	accepted chan net.Conn
	done     chan struct{} // closed when inner's Accept fails for good
	err      error         // that failure, set before done is closed
	once     sync.Once
}

// newTLSLayer starts accepting on inner. conf serves both ends: the
// accepting one as a server, the dialing one as a client.
func newTLSLayer(inner raft.StreamLayer, conf *tls.Config, log *slog.Logger) *tlsLayer {
	l := &tlsLayer{inner: inner, conf: conf, log: log, accepted: make(chan net.Conn), done: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *tlsLayer) acceptLoop() {
	for {
		c, err := l.inner.Accept()
		if err != nil {
			l.err = err
			close(l.done)
			return
		}
		go l.handshake(c)
	}
}

func (l *tlsLayer) handshake(c net.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), handshakeTimeout)
	defer cancel()
	tc := tls.Server(c, l.conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		l.log.Warn("raft: refused a connection without a valid peer certificate", "remote", c.RemoteAddr().String(), "err", err)
		c.Close()
		return
	}
	select {
	case l.accepted <- tc:
	case <-l.done:
		tc.Close()
	}
}

// Accept returns the next connection whose handshake succeeded.
func (l *tlsLayer) Accept() (net.Conn, error) {
	select {
	case c := <-l.accepted:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

// Dial connects through inner and completes the handshake before the
// transport writes.
func (l *tlsLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	c, err := l.inner.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tc := tls.Client(c, l.conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("raftlog: TLS handshake with %s: %w", addr, err)
	}
	return tc, nil
}

// Close closes the inner layer, which ends the accept loop.
func (l *tlsLayer) Close() error {
	var err error
	l.once.Do(func() { err = l.inner.Close() })
	return err
}

func (l *tlsLayer) Addr() net.Addr { return l.inner.Addr() }
