package txmqtest

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/raft"
)

// ErrDropped is what a connection fails with when its link drops traffic.
var ErrDropped = errors.New("txmqtest: link drops traffic")

// FaultNet carries Raft traffic between test nodes and breaks it on
// demand, per directed link between two Raft addresses: a link can drop
// what goes one way (Drop), both ways (Cut), or delay it (Delay).
//
// Every Raft RPC travels on a connection its sender dialed: the request
// from the dialer, the response back to it. So the layer of the dialing
// node decides everything: a dial to a peer is refused while the link to
// it drops traffic, a write fails while the link to the peer drops it, and
// a read fails while the link back from the peer drops it. A stream cannot
// lose bytes in the middle and stay usable, so a dropped message costs its
// connection, as a timeout would. With a→b dropped and b→a delivered, a
// still hears b's requests and acts on them, and b never hears back.
//
// A FaultNet is safe for concurrent use; it never sleeps holding its lock.
type FaultNet struct {
	mu    sync.Mutex
	links map[link]fault
}

type link struct{ from, to string }

type fault struct {
	drop          bool
	delay, jitter time.Duration
}

// NewFaultNet returns a network with every link working.
func NewFaultNet() *FaultNet { return &FaultNet{links: map[link]fault{}} }

// Layer is a node's Raft stream layer (raftlog.Config.StreamLayer),
// accepting on l; l's address is the node's Raft address.
func (f *FaultNet) Layer(l net.Listener) raft.StreamLayer {
	return &faultLayer{Listener: l, net: f, self: l.Addr().String()}
}

// Drop drops what goes from one Raft address to another; the other way
// still works.
func (f *FaultNet) Drop(from, to string) { f.update(drop, link{from, to}) }

// Cut drops what goes between a and b, both ways.
func (f *FaultNet) Cut(a, b string) { f.update(drop, link{a, b}, link{b, a}) }

// Partition cuts every link between a and the others, at once.
func (f *FaultNet) Partition(a string, others ...string) {
	var links []link
	for _, b := range others {
		links = append(links, link{a, b}, link{b, a})
	}
	f.update(drop, links...)
}

// Delay holds what goes from one address to another for d, give or take
// up to jitter, on each write (of the dialer) or read (of the response).
func (f *FaultNet) Delay(from, to string, d, jitter time.Duration) {
	f.update(func(l *fault) { l.delay, l.jitter = d, jitter }, link{from, to})
}

func drop(l *fault) { l.drop = true }

func (f *FaultNet) update(change func(*fault), links ...link) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range links {
		l := f.links[k]
		change(&l)
		f.links[k] = l
	}
}

// Heal makes every link work again.
func (f *FaultNet) Heal() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.links = map[link]fault{}
}

func (f *FaultNet) fault(from, to string) fault {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.links[link{from, to}]
}

// pass waits out the link's delay, then says whether traffic gets through.
func (f *FaultNet) pass(from, to string) error {
	l := f.fault(from, to)
	if d := l.delay; d > 0 {
		if l.jitter > 0 {
			d += time.Duration(rand.Int64N(int64(2*l.jitter+1))) - l.jitter
		}
		time.Sleep(max(d, 0))
		l = f.fault(from, to)
	}
	if l.drop {
		return ErrDropped
	}
	return nil
}

type faultLayer struct {
	net.Listener
	net  *FaultNet
	self string
}

func (l *faultLayer) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	peer := string(addr)
	if l.net.fault(l.self, peer).drop {
		return nil, ErrDropped
	}
	c, err := net.DialTimeout("tcp", peer, timeout)
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: c, net: l.net, self: l.self, peer: peer}, nil
}

// faultConn is a connection self dialed to peer: its writes go self→peer,
// its reads come peer→self.
type faultConn struct {
	net.Conn
	net        *FaultNet
	self, peer string
}

func (c *faultConn) Write(p []byte) (int, error) {
	if err := c.net.pass(c.self, c.peer); err != nil {
		c.Conn.Close()
		return 0, err
	}
	return c.Conn.Write(p)
}

func (c *faultConn) Read(p []byte) (int, error) {
	// Checked before blocking too, so that an idle connection of a link
	// that drops fails now, not when the peer next sends.
	if c.net.fault(c.peer, c.self).drop {
		c.Conn.Close()
		return 0, ErrDropped
	}
	n, err := c.Conn.Read(p)
	if n == 0 {
		return n, err
	}
	if perr := c.net.pass(c.peer, c.self); perr != nil {
		c.Conn.Close()
		return 0, perr
	}
	return n, err
}
