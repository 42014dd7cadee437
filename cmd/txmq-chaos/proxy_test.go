package main

import (
	"bufio"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/internal/loopback"
)

// echo is a target that answers each line with the same line and
// remembers what it received.
type echo struct {
	l    net.Listener
	mu   sync.Mutex
	got  []string
	wg   sync.WaitGroup
	quit chan struct{}
}

func newEcho(t *testing.T) *echo {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	e := &echo{l: l, quit: make(chan struct{})}
	e.wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			e.wg.Go(func() {
				defer c.Close()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					e.mu.Lock()
					e.got = append(e.got, sc.Text())
					e.mu.Unlock()
					if _, err := c.Write([]byte(sc.Text() + "\n")); err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() { l.Close(); e.wg.Wait() })
	return e
}

func (e *echo) received() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.got...)
}

// testNet is a Net whose connections are named by the local port they
// were dialed from.
type testNet struct {
	*Net
	mu    sync.Mutex
	names map[int]string
}

func newTestNet(t *testing.T) *testNet {
	tn := &testNet{names: map[int]string{}}
	tn.Net = NewNet(func(_, remote net.Addr) string {
		tn.mu.Lock()
		defer tn.mu.Unlock()
		if n, ok := tn.names[remote.(*net.TCPAddr).Port]; ok {
			return n
		}
		return anyNode
	})
	t.Cleanup(tn.Close)
	return tn
}

// tconn is a test's connection through a proxy.
type tconn struct {
	net.Conn
	r *bufio.Reader
}

// dial connects to p as node from.
func (tn *testNet) dial(t *testing.T, from string, p *Proxy) *tconn {
	a, err := loopback.StableAddr()
	require.NoError(t, err)
	local, err := net.ResolveTCPAddr("tcp", a)
	require.NoError(t, err)
	tn.mu.Lock()
	tn.names[local.Port] = from
	tn.mu.Unlock()
	c, err := (&net.Dialer{LocalAddr: local}).Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &tconn{Conn: c, r: bufio.NewReader(c)}
}

// readLine waits up to d for a line.
func (c *tconn) readLine(d time.Duration) (string, error) {
	if err := c.SetReadDeadline(time.Now().Add(d)); err != nil {
		return "", err
	}
	s, err := c.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	return s[:len(s)-1], nil
}

// roundTrip sends a line and waits up to d for its echo.
func roundTrip(c *tconn, line string, d time.Duration) (string, error) {
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return "", err
	}
	return c.readLine(d)
}

func TestProxyCutAndHeal(t *testing.T) {
	tn := newTestNet(t)
	p, err := tn.Listen("b", newEcho(t).l.Addr().String())
	require.NoError(t, err)
	rw := tn.dial(t, "a", p)
	got, err := roundTrip(rw, "one", time.Second)
	require.NoError(t, err)
	require.Equal(t, "one", got)

	tn.Cut("a", "b")
	_, err = roundTrip(rw, "two", time.Second)
	require.Error(t, err, "a cut closes the link's connections")
	_, err = roundTrip(tn.dial(t, "a", p), "three", time.Second)
	require.Error(t, err, "a cut refuses new connections")
	got, err = roundTrip(tn.dial(t, "c", p), "from c", time.Second)
	require.NoError(t, err, "other links still work")
	require.Equal(t, "from c", got)

	tn.Heal()
	got, err = roundTrip(tn.dial(t, "a", p), "four", time.Second)
	require.NoError(t, err)
	require.Equal(t, "four", got)
}

func TestProxyOneWayDrop(t *testing.T) {
	tn := newTestNet(t)
	e := newEcho(t)
	p, err := tn.Listen("b", e.l.Addr().String())
	require.NoError(t, err)
	rw := tn.dial(t, "a", p)

	// b's answers to a are held: the request arrives, the echo does not.
	tn.Drop("b", "a")
	_, err = roundTrip(rw, "held", 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Equal(t, []string{"held"}, e.received())

	// Healed, the held answer arrives: nothing was discarded.
	tn.Heal()
	s, err := rw.readLine(time.Second)
	require.NoError(t, err)
	require.Equal(t, "held", s)

	// a's requests to b are held: nothing arrives until the heal.
	tn.Drop("a", "b")
	_, err = roundTrip(rw, "late", 300*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Equal(t, []string{"held"}, e.received())
	tn.Heal()
	s, err = rw.readLine(time.Second)
	require.NoError(t, err)
	require.Equal(t, "late", s)
}

func TestProxyDelay(t *testing.T) {
	tn := newTestNet(t)
	p, err := tn.Listen("b", newEcho(t).l.Addr().String())
	require.NoError(t, err)
	rw := tn.dial(t, "a", p)
	tn.Delay("a", "b", 150*time.Millisecond, 50*time.Millisecond)
	start := time.Now()
	got, err := roundTrip(rw, "slow", 2*time.Second)
	require.NoError(t, err)
	require.Equal(t, "slow", got)
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond)
}

// TestConnOwner: the proxy finds which process dialed it, through /proc.
func TestConnOwner(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("no /proc/net/tcp here:", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s, err := l.Accept()
	require.NoError(t, err)
	defer s.Close()
	id, err := connOwner(map[int]string{os.Getpid(): "me"}, s.LocalAddr(), s.RemoteAddr())
	require.NoError(t, err)
	require.Equal(t, "me", id)
	_, err = connOwner(map[int]string{os.Getppid(): "parent"}, s.LocalAddr(), s.RemoteAddr())
	require.ErrorIs(t, err, errUnknownOwner)
}
