package txmqtest

import (
	"net"
	"testing"
	"time"
)

// Listen listens on a new port of 127.0.0.1, closed when the test ends
// unless the code it is handed to closed it first. Tests hand listeners
// over (broker.Config.GRPCListener, raftlog.Config.Listener) instead of
// choosing a port, closing it and listening on it again, which races with
// everything else that binds ports on the machine.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("txmqtest: listen: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// ListenOn listens on addr again, the exact address a stopped node had, so
// that it comes back where its peers and clients know it. The address may
// stay taken for a moment by a connection the system gave its port to, so
// it is retried.
func ListenOn(t testing.TB, addr string) net.Listener {
	t.Helper()
	var l net.Listener
	CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	t.Cleanup(func() { l.Close() })
	return l
}
