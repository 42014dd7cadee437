// Package loopback says whether an address names this machine only, one
// rule for the broker (loopback callbacks, plaintext listeners, pprof) and
// the client (tokens over plaintext).
package loopback

import (
	"net"
	"strings"
)

// Host reports whether host names this machine only: localhost (or a name
// under .localhost) or a loopback IP.
func Host(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Addr is Host of addr's host: addr is host:port, or a host alone.
func Addr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return Host(host)
}
