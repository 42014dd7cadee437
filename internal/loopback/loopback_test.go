package loopback

import "testing"

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
