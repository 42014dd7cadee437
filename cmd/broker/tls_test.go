package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// Off loopback without TLS the broker refuses to start, in one line that
// says what to give; --insecure lets it past the check (here to an
// address no interface has, so nothing is exposed: the listen fails).
// TLS settings that cannot work are usage errors too.
func TestPlaintextOffLoopbackRefused(t *testing.T) {
	f := txmqtest.NewCA(t, "txmq").Files("n1")
	certArgs := []string{"--tls-cert", f.Cert, "--tls-key", f.Key}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:7420"}, "broker: --listen 0.0.0.0:7420 is not a loopback address and the API has no TLS: give --tls-cert and --tls-key"},
		{[]string{"--raft-listen", "[::]:7421"}, "broker: --raft-listen [::]:7421 is not a loopback address and the nodes speak without TLS: give --peer-tls-cert"},
		{[]string{"--tls-client-auth", "require", "--tls-cert", "c.pem", "--tls-key", "k.pem"}, "--tls-client-auth require needs --tls-client-ca"},
		{[]string{"--tls-cert", "c.pem"}, "needs its key"},
		{[]string{"--peer-tls-ca", "ca.pem"}, "peer TLS needs a certificate and key"},
		{append([]string{"--join", "127.0.0.1:7420"}, certArgs...), "give the cluster's CA (--peer-tls-ca, or --tls-client-ca)"},
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

// The broker binary over TLS: served to a client of its CA, and after the
// files are replaced and SIGHUP sent, new connections get the new
// certificate while one made before keeps working.
func TestTLSFilesReadAgainOnSIGHUP(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	old, next := txmqtest.NewCA(t, "old"), txmqtest.NewCA(t, "next")
	files := old.Files("n1")
	p := startProc(t, brokerBin(t), "--data", t.TempDir(), "--listen", anyPort, "--raft-listen", anyPort, "--metrics-listen", "",
		"--log-level", "warn", "--tls-cert", files.Cert, "--tls-key", files.Key)
	status := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := txmqv1.NewAdminServiceClient(conn).ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
		return err
	}
	dial := func(ca *txmqtest.CA) *grpc.ClientConn {
		conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(credentials.NewTLS(ca.Client(""))))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	before := dial(old)
	require.NoError(t, status(before))

	_, err := next.WriteFiles(filepath.Dir(files.Cert), "n1", "127.0.0.1", "localhost")
	require.NoError(t, err)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGHUP))
	// Within 5 s: the files are also looked at every 10 s, SIGHUP is what
	// reads them here.
	txmqtest.CheckFor(t, 5*time.Second, 50*time.Millisecond, func() error { return status(dial(next)) })
	require.Error(t, status(dial(old)), "a new connection gets the new certificate")
	require.NoError(t, status(before), "the connection made before still works")
}
