package txmqtest

import (
	"net"
	"testing"
	"time"

	"github.com/txmq/txmq/internal/loopback"
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

// ListenOn listens on addr again, the exact address a stopped node had
// (loopback.ListenAgain, for up to 10 seconds).
func ListenOn(t testing.TB, addr string) net.Listener {
	t.Helper()
	l, err := loopback.ListenAgain(addr, 10*time.Second)
	if err != nil {
		t.Fatalf("txmqtest: listen again on %s: %v", addr, err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}
