package txmqtest_test

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/internal/txmqtest"
)

// peer is one end of the fault network: a layer, and the lines its server
// received.
type peer struct {
	layer raft.StreamLayer
	addr  string
	got   chan string
}

// newPeer serves a layer of fn that answers every line it reads with "ok".
func newPeer(t *testing.T, fn *txmqtest.FaultNet) *peer {
	l := txmqtest.Listen(t)
	p := &peer{layer: fn.Layer(l), addr: l.Addr().String(), got: make(chan string, 100)}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := p.layer.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				sc := bufio.NewScanner(c)
				for sc.Scan() {
					select {
					case p.got <- sc.Text():
					default: // a busy test does not look at every line
					}
					if _, err := c.Write([]byte("ok\n")); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		p.layer.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// dial opens a connection from p to another peer.
func (p *peer) dial(to *peer) (net.Conn, error) {
	return p.layer.Dial(raft.ServerAddress(to.addr), 5*time.Second)
}

// ask sends a line on c and reads the answer.
func ask(c net.Conn, line string) error {
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte(line + "\n")); err != nil {
		return err
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if answer != "ok\n" {
		return errors.New("unexpected answer " + answer)
	}
	return nil
}

// roundTrip dials from p to another peer, sends a line and reads the
// answer.
func (p *peer) roundTrip(to *peer, line string) error {
	c, err := p.dial(to)
	if err != nil {
		return err
	}
	defer c.Close()
	return ask(c, line)
}

// received waits for the next line p got.
func (p *peer) received(t *testing.T) string {
	t.Helper()
	select {
	case l := <-p.got:
		return l
	case <-time.After(10 * time.Second):
		t.Fatal("nothing received")
		return ""
	}
}

func TestFaultNetCutAndHeal(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	a, b, c := newPeer(t, fn), newPeer(t, fn), newPeer(t, fn)
	require.NoError(t, a.roundTrip(b, "hello"))
	require.Equal(t, "hello", b.received(t))

	open, err := a.dial(b)
	require.NoError(t, err)
	defer open.Close()
	require.NoError(t, ask(open, "before"))
	require.Equal(t, "before", b.received(t))

	fn.Cut(a.addr, b.addr)
	require.ErrorIs(t, a.roundTrip(b, "x"), txmqtest.ErrDropped)
	require.ErrorIs(t, b.roundTrip(a, "x"), txmqtest.ErrDropped)
	require.ErrorIs(t, ask(open, "after"), txmqtest.ErrDropped, "a connection opened before the cut fails")
	require.NoError(t, a.roundTrip(c, "other links work"))
	require.Equal(t, "other links work", c.received(t))
	require.Empty(t, b.got, "nothing crossed the cut")

	fn.Heal()
	require.NoError(t, a.roundTrip(b, "healed"))
	require.Equal(t, "healed", b.received(t))
	require.NoError(t, b.roundTrip(a, "healed"))
	require.Equal(t, "healed", a.received(t))
}

// a→b dropped: a cannot reach b, b's requests reach a, and a's answers do
// not reach b.
func TestFaultNetOneWayDrop(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	a, b := newPeer(t, fn), newPeer(t, fn)
	fn.Drop(a.addr, b.addr)

	require.ErrorIs(t, a.roundTrip(b, "x"), txmqtest.ErrDropped)
	require.ErrorIs(t, b.roundTrip(a, "from b"), txmqtest.ErrDropped, "a's answer is dropped")
	require.Equal(t, "from b", a.received(t), "b's request got through")
	require.Empty(t, b.got)

	fn.Heal()
	require.NoError(t, a.roundTrip(b, "healed"))
	require.Equal(t, "healed", b.received(t))
	require.NoError(t, b.roundTrip(a, "healed"))
	require.Equal(t, "healed", a.received(t))
}

// A delay holds traffic at least as long as asked (no upper bound: the
// machine may be slow).
func TestFaultNetDelay(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	a, b := newPeer(t, fn), newPeer(t, fn)
	fn.Delay(a.addr, b.addr, 100*time.Millisecond, 0)
	fn.Delay(b.addr, a.addr, 100*time.Millisecond, 50*time.Millisecond)
	start := time.Now()
	require.NoError(t, a.roundTrip(b, "slow"))
	require.GreaterOrEqual(t, time.Since(start), 150*time.Millisecond, "100 ms there, at least 50 ms back")
	require.Equal(t, "slow", b.received(t))
	fn.Heal()
	require.NoError(t, a.roundTrip(b, "fast"))
}

// Links change while traffic flows: no data race, and once healed every
// link works.
func TestFaultNetConcurrentChanges(t *testing.T) {
	fn := txmqtest.NewFaultNet()
	a, b := newPeer(t, fn), newPeer(t, fn)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				// Fails while cut; what matters is that it ends.
				_ = a.roundTrip(b, "busy")
			}
		}()
	}
	for i := range 50 {
		switch i % 3 {
		case 0:
			fn.Cut(a.addr, b.addr)
		case 1:
			fn.Delay(a.addr, b.addr, time.Millisecond, time.Millisecond)
		default:
			fn.Heal()
		}
	}
	close(done)
	wg.Wait()
	fn.Heal()
	require.NoError(t, a.roundTrip(b, "healed"), "b answered: the link works both ways")
}
