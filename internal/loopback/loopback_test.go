package loopback

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7420": true, "127.9.9.9:1": true, "[::1]:7420": true, "::1": true,
		"localhost:7420": true, "LOCALHOST": true, "localhost.": true, "api.localhost:80": true,
		"0.0.0.0:7420": false, ":7420": false, "10.0.0.1:7420": false, "example.com:443": false,
		"localhost.example.com": false, "": false,
	} {
		if got := Addr(addr); got != want {
			t.Errorf("Addr(%q) = %t, want %t", addr, got, want)
		}
	}
}

func TestStableAddr(t *testing.T) {
	addr, err := StableAddr()
	if err != nil {
		t.Fatal(err)
	}
	if !Addr(addr) {
		t.Fatalf("StableAddr %q is not on loopback", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on StableAddr %q: %v", addr, err)
	}
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	if p, _ := strconv.Atoi(port); p < 1024 || p >= 61000 {
		t.Fatalf("StableAddr port %d out of range", p)
	}
}

// Callers pick several addresses before anything listens on them, so
// StableAddr never returns a port twice in a process: 2,000 picks from its
// 10,000 ports would repeat one almost surely by chance alone.
func TestStableAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 2000 {
		addr, err := StableAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("StableAddr returned %s twice", addr)
		}
		seen[addr] = true
	}
}

// ListenAgain waits for a taken port to be let go, and gives up with the
// error after its wait.
func TestListenAgain(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	if _, err := ListenAgain(addr, 50*time.Millisecond); !errors.Is(err, syscall.EADDRINUSE) {
		held.Close()
		t.Fatalf("ListenAgain on a port still taken: %v, want address already in use", err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		held.Close()
	}()
	l, err := ListenAgain(addr, 10*time.Second)
	if err != nil {
		t.Fatalf("ListenAgain after the port was let go: %v", err)
	}
	l.Close()
}
