package loopback

import (
	"net"
	"strconv"
	"testing"
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
