package main

import (
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// link is one direction between two nodes: bytes from node from to node to.
type link struct{ from, to string }

// linkFault is what the network does to one direction of a link.
type linkFault struct {
	// cut closes the link's connections and refuses new ones.
	cut bool
	// drop holds the direction's bytes (the sender's writes back up and
	// its RPCs time out) until the fault is lifted; the other direction
	// still flows. Nothing is discarded, so a healed stream stays intact:
	// TCP retransmits after a loss.
	drop bool
	// delay, plus up to jitter, before each chunk is forwarded.
	delay, jitter time.Duration
}

// anyNode stands for a connection whose dialing node could not be told.
const anyNode = "?"

// Net holds the faults of every link and the proxies that apply them.
// Each node's Raft traffic reaches it through its own proxy (the address
// the node advertises); the proxy learns which node dialed from who owns
// the connection's other end (see Owner).
type Net struct {
	mu      sync.Mutex
	faults  map[link]linkFault
	conns   map[*proxyConn]struct{}
	proxies []*Proxy
	owner   func(local, remote net.Addr) string
	// accepted counts the proxied connections; unknown, those whose
	// dialing node could not be told (they get no link fault).
	accepted, unknown atomic.Int64
}

// NewNet returns a network without faults. owner names the node that
// dialed a connection a proxy accepted (anyNode if unknown).
func NewNet(owner func(local, remote net.Addr) string) *Net {
	return &Net{faults: map[link]linkFault{}, conns: map[*proxyConn]struct{}{}, owner: owner}
}

// Cut cuts a and b apart in both directions.
func (n *Net) Cut(a, b string) {
	n.set(func(f *linkFault) { f.cut = true }, link{a, b}, link{b, a})
}

// Isolate cuts a from every node in others.
func (n *Net) Isolate(a string, others []string) {
	for _, o := range others {
		if o != a {
			n.Cut(a, o)
		}
	}
}

// Drop holds the bytes from one node to another, one way.
func (n *Net) Drop(from, to string) {
	n.set(func(f *linkFault) { f.drop = true }, link{from, to})
}

// Delay delays every chunk from one node to another by d plus up to jitter.
func (n *Net) Delay(from, to string, d, jitter time.Duration) {
	n.set(func(f *linkFault) { f.delay, f.jitter = d, jitter }, link{from, to})
}

// Heal lifts every fault.
func (n *Net) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.faults)
}

func (n *Net) set(change func(*linkFault), links ...link) {
	n.mu.Lock()
	var closing []*proxyConn
	for _, l := range links {
		f := n.faults[l]
		change(&f)
		n.faults[l] = f
		if f.cut {
			for c := range n.conns {
				if c.from == l.from && c.to == l.to {
					closing = append(closing, c)
				}
			}
		}
	}
	n.mu.Unlock()
	for _, c := range closing {
		c.close()
	}
}

// fault is the fault of one direction; a connection of unknown origin
// suffers what every link into its target suffers in common, which is
// nothing unless the target is cut from everyone.
func (n *Net) fault(from, to string) linkFault {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.faults[link{from, to}]
}

// Close closes every proxy and connection.
func (n *Net) Close() {
	n.mu.Lock()
	proxies := n.proxies
	conns := make([]*proxyConn, 0, len(n.conns))
	for c := range n.conns {
		conns = append(conns, c)
	}
	n.mu.Unlock()
	for _, p := range proxies {
		p.l.Close()
	}
	for _, c := range conns {
		c.close()
	}
	for _, p := range proxies {
		p.wg.Wait()
	}
}

// Proxy forwards the connections to one node's Raft listener.
type Proxy struct {
	net    *Net
	node   string
	target string
	l      net.Listener
	wg     sync.WaitGroup
}

// Listen starts the proxy in front of node, whose Raft listener is target,
// on a free loopback port.
func (n *Net) Listen(node, target string) (*Proxy, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{net: n, node: node, target: target, l: l}
	n.mu.Lock()
	n.proxies = append(n.proxies, p)
	n.mu.Unlock()
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the address the node advertises.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		from := p.net.owner(c.LocalAddr(), c.RemoteAddr())
		p.net.accepted.Add(1)
		if from == anyNode {
			p.net.unknown.Add(1)
		}
		if p.net.fault(from, p.node).cut || p.net.fault(p.node, from).cut {
			c.Close()
			continue
		}
		p.wg.Go(func() { p.serve(c, from) })
	}
}

func (p *Proxy) serve(in net.Conn, from string) {
	out, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		in.Close()
		return
	}
	c := &proxyConn{from: from, to: p.node, in: in, out: out}
	p.net.mu.Lock()
	p.net.conns[c] = struct{}{}
	p.net.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(c, out, in, from, p.node) })
	wg.Go(func() { p.pump(c, in, out, p.node, from) })
	wg.Wait()
	p.net.mu.Lock()
	delete(p.net.conns, c)
	p.net.mu.Unlock()
}

// pump copies src to dst, the direction from → to, applying its fault
// to each chunk; it closes the connection when either side ends.
func (p *Proxy) pump(c *proxyConn, dst io.Writer, src io.Reader, from, to string) {
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 && !p.forward(c, dst, buf[:k], from, to) {
			return
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forward(c *proxyConn, dst io.Writer, b []byte, from, to string) bool {
	for {
		f := p.net.fault(from, to)
		switch {
		case f.cut || c.isClosed():
			return false
		case f.drop:
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if d := f.delay + jitter(f.jitter); d > 0 {
			time.Sleep(d)
		}
		_, err := dst.Write(b)
		return err == nil
	}
}

func jitter(j time.Duration) time.Duration {
	if j <= 0 {
		return 0
	}
	return rand.N(j)
}

// proxyConn is one forwarded connection.
type proxyConn struct {
	from, to string
	in, out  net.Conn
	mu       sync.Mutex
	closed   bool
}

func (c *proxyConn) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	c.in.Close()
	c.out.Close()
}

func (c *proxyConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// errUnknownOwner says no known process holds a connection's other end.
var errUnknownOwner = errors.New("chaos: no known process owns the connection")
