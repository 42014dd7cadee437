package checkback

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// ErrRefused wraps the error of a check-back that was not made because
// the endpoint's address is not allowed (Guard). It is also ErrNotReached:
// such a check is not delivered and does not count against max_checks.
var ErrRefused = errors.New("callback address not allowed")

// neverCalled are link-local and cloud metadata addresses: no allowlist
// lets the broker call them.
var neverCalled = []netip.Prefix{
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fe80::/10"),
	netip.MustParsePrefix("fd00:ec2::254/128"),
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("::/128"),
}

// DefaultCallbackAllow is loopback: a broker on its own machine calls
// producers on the same machine. The addresses producers register from
// are allowed on top of any list.
var DefaultCallbackAllow = []string{"127.0.0.0/8", "::1/128", "localhost"}

// maxRegisteredFrom bounds the remembered addresses producers registered
// from; the oldest is forgotten first.
const maxRegisteredFrom = 4096

// Guard decides which callback addresses the broker may call, so that an
// API caller cannot make it send requests to any address it names
// (SSRF): hosts and networks the operator allows (--callback-allow), and
// the addresses producers registered from. A name is allowed only as a
// name (it is never resolved to decide); the address finally dialled is
// checked again, so that no name leads to a link-local or metadata one.
type Guard struct {
	names    []string // exact, or a suffix after "*."
	prefixes []netip.Prefix

	mu   sync.Mutex
	from []netip.Addr // oldest first
}

// NewGuard parses an allowlist of host names ("payments.internal",
// "*.internal"), IP addresses and CIDR networks; none means
// DefaultCallbackAllow.
func NewGuard(allow []string) (*Guard, error) {
	if len(allow) == 0 {
		allow = DefaultCallbackAllow
	}
	g := &Guard{}
	for _, a := range allow {
		a = strings.ToLower(strings.TrimSpace(a))
		if p, err := netip.ParsePrefix(a); err == nil {
			g.prefixes = append(g.prefixes, p.Masked())
			continue
		}
		if ip, err := netip.ParseAddr(a); err == nil {
			g.prefixes = append(g.prefixes, netip.PrefixFrom(ip, ip.BitLen()))
			continue
		}
		name := strings.TrimPrefix(a, "*.")
		if name == "" || strings.ContainsAny(name, "/:*[] ") {
			return nil, fmt.Errorf("checkback: callback allowlist entry %q is not a host name, *.domain, IP address or CIDR network", a)
		}
		g.names = append(g.names, a)
	}
	return g, nil
}

// RegisteredFrom allows the address a producer registered from.
func (g *Guard) RegisteredFrom(ip netip.Addr) {
	ip = ip.Unmap()
	g.mu.Lock()
	defer g.mu.Unlock()
	if i := slices.Index(g.from, ip); i >= 0 {
		g.from = slices.Delete(g.from, i, i+1)
	}
	if len(g.from) >= maxRegisteredFrom {
		g.from = g.from[1:]
	}
	g.from = append(g.from, ip)
}

// Check says whether host (a name or an IP address) may be called.
func (g *Guard) Check(host string) error {
	host = strings.ToLower(strings.TrimSuffix(strings.Trim(host, "[]"), "."))
	if ip, err := netip.ParseAddr(host); err == nil {
		return g.checkIP(ip)
	}
	for _, n := range g.names {
		if n == host || (strings.HasPrefix(n, "*.") && strings.HasSuffix(host, n[1:])) {
			return nil
		}
	}
	return fmt.Errorf("%w: %s is not in the callback allowlist (--callback-allow)", ErrRefused, host)
}

// never refuses link-local and metadata addresses.
func never(ip netip.Addr) error {
	if slices.ContainsFunc(neverCalled, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		return fmt.Errorf("%w: %s is a link-local or metadata address, which is never called", ErrRefused, ip)
	}
	return nil
}

func (g *Guard) checkIP(ip netip.Addr) error {
	ip = ip.Unmap()
	if err := never(ip); err != nil {
		return err
	}
	if slices.ContainsFunc(g.prefixes, func(p netip.Prefix) bool { return p.Contains(ip) }) {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if slices.Contains(g.from, ip) {
		return nil
	}
	return fmt.Errorf("%w: %s is neither in the callback allowlist (--callback-allow) nor an address a producer registered from", ErrRefused, ip)
}

// control checks the address a dial is about to connect to: never a
// link-local or metadata one, whatever name led there.
func (g *Guard) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrRefused, address, err)
	}
	return never(ap.Addr().Unmap())
}

// dialer connects only where control lets it.
func (g *Guard) dialer() *net.Dialer { return &net.Dialer{Control: g.control} }

// Host is the host an endpoint calls ("" for a session).
func (e Endpoint) Host() string {
	switch {
	case e.GRPC != "":
		host, _, _ := net.SplitHostPort(e.GRPC)
		return host
	case e.HTTP != "":
		if u, err := url.Parse(e.HTTP); err == nil {
			return u.Hostname()
		}
	}
	return ""
}
