package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Off loopback without TLS the broker refuses to start, in one line that
// says what to give; --insecure lets it past the check (here to an
// address no interface has, so nothing is exposed: the listen fails).
func TestPlaintextOffLoopbackRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:7420"}, "broker: --listen 0.0.0.0:7420 is not a loopback address and the API has no TLS: give --tls-cert and --tls-key"},
		{[]string{"--raft-listen", "[::]:7421"}, "broker: --raft-listen [::]:7421 is not a loopback address and the nodes speak without TLS: give --peer-tls-cert"},
		{[]string{"--tls-client-auth", "require", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, "--tls-client-auth require needs --tls-client-ca"},
		{[]string{"--tls-cert", "c.pem"}, "needs its key"},
		{[]string{"--peer-tls-ca", "ca.pem"}, "peer TLS needs a certificate and key"},
	} {
		var out, errOut strings.Builder
		args := append([]string{"--data", t.TempDir(), "--metrics-listen", ""}, tc.args...)
		require.Equal(t, 2, run(args, noEnv, &out, &errOut), "%v", tc.args)
		require.Contains(t, errOut.String(), tc.want)
		require.Equal(t, 1, strings.Count(errOut.String(), "\n"), "one line: %q", errOut.String())
	}
	var out, errOut strings.Builder
	args := []string{"--data", t.TempDir(), "--metrics-listen", "", "--insecure", "--listen", "192.0.2.1:7420", "--raft-listen", anyPort}
	require.Equal(t, 1, run(args, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "listen 192.0.2.1:7420", "past the check, the listen itself fails")
}
