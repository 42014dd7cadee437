package broker

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// faultNet cuts Raft links between test nodes: a node cannot dial a peer it
// is cut from, and connections it dialed before fail once the link is cut.
// Every Raft RPC travels on a connection its sender dialed, so cutting
// dials and dialed connections cuts both directions.
type faultNet struct {
	mu  sync.Mutex
	cut map[[2]string]bool // raft address pairs, both orders
}

var errCut = errors.New("faultnet: link cut")

func newFaultNet() *faultNet { return &faultNet{cut: map[[2]string]bool{}} }

func (f *faultNet) isCut(a, b string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cut[[2]string{a, b}]
}

// partition cuts every link between a and the others.
func (f *faultNet) partition(a string, others ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, b := range others {
		f.cut[[2]string{a, b}] = true
		f.cut[[2]string{b, a}] = true
	}
}

func (f *faultNet) heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cut = map[[2]string]bool{}
}

// layer listens on addr (127.0.0.1:0 for a new port) for one node.
func (f *faultNet) layer(addr string) (*faultLayer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &faultLayer{Listener: ln, net: f}, nil
}

type faultLayer struct {
	net.Listener
	net *faultNet
}

var _ raft.StreamLayer = (*faultLayer)(nil)

func (l *faultLayer) self() string { return l.Addr().String() }

func (l *faultLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	if l.net.isCut(l.self(), string(addr)) {
		return nil, errCut
	}
	c, err := net.DialTimeout("tcp", string(addr), timeout)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, check: func() bool { return l.net.isCut(l.self(), string(addr)) }}, nil
}

type faultConn struct {
	net.Conn
	check func() bool
}

func (c *faultConn) Read(p []byte) (int, error) {
	if c.check() {
		c.Conn.Close()
		return 0, errCut
	}
	n, err := c.Conn.Read(p)
	if err == nil && c.check() {
		c.Conn.Close()
		return 0, errCut
	}
	return n, err
}

func (c *faultConn) Write(p []byte) (int, error) {
	if c.check() {
		c.Conn.Close()
		return 0, errCut
	}
	return c.Conn.Write(p)
}
