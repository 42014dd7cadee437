package loopback

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// StableAddr picks a free port of 127.0.0.1 below the ephemeral range, for
// a process that must listen on an address chosen before it starts, or come
// back on the same address after a restart. A port from the ephemeral
// range may meanwhile become the source port of some outgoing connection
// on the machine (tests dial a lot), and the listen would then fail with
// "address already in use"; below that range only an explicit listen can
// take it. A port is handed out once: callers pick several addresses
// before their processes listen on any, and the probe's listen is closed at
// once, so without a record a second pick could return the first. The
// record is this process's, and, where the system has file locks, a lock
// held on a file named after the port for as long as the process runs, so
// that processes picking at the same time (go test runs packages in
// parallel) do not hand out the same port either.
func StableAddr() (string, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 12000 {
				low = v
			}
		}
	}
	handed.Lock()
	defer handed.Unlock()
	for range 100 {
		port := low - 10000 + rand.IntN(10000)
		if handed.ports[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		if !claim(port) {
			continue
		}
		handed.ports[port] = true
		return addr, nil
	}
	return "", errors.New("loopback: no free port below the ephemeral range")
}

// handed holds the ports StableAddr has returned in this process.
var handed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// ListenAgain listens on addr, the exact address a stopped node had, so
// that it comes back where its peers and clients know it. The port may
// stay taken for a moment (by a connection the system gave it to as its
// source port), so "address already in use" is tried again for up to
// wait; any other error is returned at once.
func ListenAgain(addr string, wait time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(wait)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return l, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
