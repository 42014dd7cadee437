package checkback

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// noDial fails the test if the caller dials at all: the refusals must
// come before any connection (and no packet leaves 127.0.0.0/8).
func noDial(t *testing.T) func(context.Context, string, string) (net.Conn, error) {
	return func(_ context.Context, _, addr string) (net.Conn, error) {
		t.Errorf("dialled %s", addr)
		return nil, errors.New("must not dial")
	}
}

// TestGuardRefusesBeforeDialling: disallowed hosts, link-local and
// metadata addresses (even when an allowlist covers them) are refused
// before any dial, as not delivered.
func TestGuardRefusesBeforeDialling(t *testing.T) {
	g, err := NewGuard([]string{"127.0.0.0/8", "169.254.0.0/16", "fd00::/8", "payments.internal"})
	require.NoError(t, err)
	c := NewNetCaller(g)
	c.dial = noDial(t)
	defer c.Close()
	for _, ep := range []string{
		"http://169.254.169.254/latest/meta-data/",
		"http://[fd00:ec2::254]/",
		"http://[fe80::1]:80/",
		"http://evil.example/check",
		"http://10.1.2.3:8080/check",
		"http://0.0.0.0:8080/check",
		"grpc://169.254.169.254:443",
		"grpc://evil.example:443",
		"grpc://[::ffff:169.254.169.254]:443",
	} {
		e, err := ParseEndpoint(ep)
		require.NoError(t, err, ep)
		_, err = c.Check(context.Background(), e, checkReq())
		require.ErrorIs(t, err, ErrRefused, ep)
		require.ErrorIs(t, err, ErrNotReached, "%s: a refused check is not delivered", ep)
	}
	require.NoError(t, g.Check("payments.internal"))
	require.NoError(t, g.Check("127.0.0.2"))
}

func TestGuardAllowlist(t *testing.T) {
	g, err := NewGuard(nil)
	require.NoError(t, err)
	for _, h := range []string{"127.0.0.1", "::1", "localhost", "[::1]"} {
		require.NoError(t, g.Check(h), h)
	}
	require.ErrorIs(t, g.Check("10.0.0.5"), ErrRefused)
	g.RegisteredFrom(netip.MustParseAddr("10.0.0.5"))
	require.NoError(t, g.Check("10.0.0.5"), "the address a producer registered from is allowed")
	require.ErrorIs(t, g.Check("10.0.0.6"), ErrRefused)
	g.RegisteredFrom(netip.MustParseAddr("169.254.169.254"))
	require.ErrorIs(t, g.Check("169.254.169.254"), ErrRefused, "never, even registered from")

	g, err = NewGuard([]string{"*.corp.example", "10.0.0.0/8"})
	require.NoError(t, err)
	require.NoError(t, g.Check("pay.corp.example"))
	require.NoError(t, g.Check("10.9.8.7"))
	require.ErrorIs(t, g.Check("corp.example.evil"), ErrRefused)
	require.ErrorIs(t, g.Check("127.0.0.1"), ErrRefused, "a list replaces the default")

	for _, bad := range []string{"http://x", "a b", "*"} {
		_, err := NewGuard([]string{bad})
		require.ErrorContains(t, err, "is not a host name", bad)
	}
	// The dial-time check: whatever name led there.
	require.ErrorIs(t, g.control("tcp4", "169.254.169.254:80", nil), ErrRefused)
	require.NoError(t, g.control("tcp4", "127.0.0.1:80", nil))
}

// TestRedirectNotFollowed: a callback that redirects (here to another
// loopback server, which must not be called) is not delivered.
func TestRedirectNotFollowed(t *testing.T) {
	var hit atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hit.Store(true)
		w.Write([]byte(`{"resolution":"commit"}`))
	}))
	defer target.Close()
	for _, to := range []string{target.URL, "http://169.254.169.254/latest/meta-data/"} {
		srv := httptest.NewServer(http.RedirectHandler(to, http.StatusTemporaryRedirect))
		c := NewNetCaller(nil)
		ep, err := ParseEndpoint(srv.URL)
		require.NoError(t, err)
		_, err = c.Check(context.Background(), ep, checkReq())
		require.ErrorIs(t, err, ErrNotReached)
		require.ErrorContains(t, err, "not followed")
		c.Close()
		srv.Close()
	}
	require.False(t, hit.Load(), "the redirect was followed")
}

// TestAnswerSizeLimited: an answer over the limit is not read whole.
func TestAnswerSizeLimited(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"resolution":"commit","pad":"` + strings.Repeat("x", 1<<20) + `"}`))
	}))
	defer srv.Close()
	c := NewNetCaller(nil)
	defer c.Close()
	ep, err := ParseEndpoint(srv.URL)
	require.NoError(t, err)
	res, err := c.Check(context.Background(), ep, checkReq())
	require.Error(t, err)
	require.Equal(t, txmqv1.Resolution(0), res)
}
