package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/tlsconf"
	"github.com/txmq/txmq/internal/txmqtest"
)

// clusterStatus calls the API at addr on a connection of its own.
func clusterStatus(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = txmqv1.NewAdminServiceClient(conn).ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
	return err
}

// foreignClient trusts ca's brokers and presents a certificate of other
// whatever the broker asks for (crypto/tls would otherwise send none, as
// other is not among the CAs the broker names).
func foreignClient(ca, other *txmqtest.CA) *tls.Config {
	conf := ca.Client("")
	cert := other.Client("intruder").Certificates[0]
	conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return conf
}

// With --tls-client-auth require, only a client certificate of the
// client CA gets through the handshake.
func TestTLSClientAuthRequire(t *testing.T) {
	ca, other := txmqtest.NewCA(t, "txmq"), txmqtest.NewCA(t, "other")
	tb := startBroker(t, func(cfg *Config) { cfg.TLS = ca.Source("broker").ServerConfig(tls.RequireAndVerifyClientCert) })
	foreign := foreignClient(ca, other)
	for name, creds := range map[string]credentials.TransportCredentials{
		"no client certificate":             credentials.NewTLS(ca.Client("")),
		"a certificate of another CA":       credentials.NewTLS(foreign),
		"a plaintext client":                insecure.NewCredentials(),
		"a client that does not trust ours": credentials.NewTLS(other.Client("app")),
	} {
		require.Equal(t, codes.Unavailable, codeOf(clusterStatus(t, tb.Addr(), creds)), name)
	}
	require.NoError(t, clusterStatus(t, tb.Addr(), credentials.NewTLS(ca.Client("app"))))
}

// With --tls-client-auth request, a client without a certificate is
// served, one with a certificate of another CA is not.
func TestTLSClientAuthRequest(t *testing.T) {
	ca, other := txmqtest.NewCA(t, "txmq"), txmqtest.NewCA(t, "other")
	tb := startBroker(t, func(cfg *Config) { cfg.TLS = ca.Source("broker").ServerConfig(tls.VerifyClientCertIfGiven) })
	require.NoError(t, clusterStatus(t, tb.Addr(), credentials.NewTLS(ca.Client(""))), "no client certificate")
	require.NoError(t, clusterStatus(t, tb.Addr(), credentials.NewTLS(ca.Client("app"))), "a certificate of the CA")
	foreign := foreignClient(ca, other)
	require.Equal(t, codes.Unavailable, codeOf(clusterStatus(t, tb.Addr(), credentials.NewTLS(foreign))), "a certificate of another CA")
}

// New certificate files are served to new handshakes once the watcher
// sees them; a connection made before keeps working.
func TestTLSCertificateReadAgain(t *testing.T) {
	old, next := txmqtest.NewCA(t, "old"), txmqtest.NewCA(t, "next")
	files := old.Files("broker")
	src, err := tlsconf.Load(files)
	require.NoError(t, err)
	tb := startBroker(t, func(cfg *Config) { cfg.TLS = src.ServerConfig(tls.NoClientCert) })
	require.NoError(t, tb.dial(credentials.NewTLS(old.Client(""))))
	ctx := ctxT(t)
	_, err = tb.admin.ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
	require.NoError(t, err)

	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	go tlsconf.Watch(watchCtx, 20*time.Millisecond, nil, txmqtest.Logger(), src)
	_, err = next.WriteFiles(filepath.Dir(files.Cert), "broker", "127.0.0.1", "localhost")
	require.NoError(t, err)
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		d := tls.Dialer{Config: next.Client("")}
		c, err := d.DialContext(ctx, "tcp", tb.Addr())
		if err != nil {
			return err
		}
		return c.Close()
	})
	require.Error(t, clusterStatus(t, tb.Addr(), credentials.NewTLS(old.Client(""))), "new connections get the new certificate")
	_, err = tb.admin.ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
	require.NoError(t, err, "the connection made before still works")
}

// A cluster with mutual TLS between nodes (Raft and joining over the
// API) forms, shrugs off a plaintext and a foreign client on its Raft
// port, and fails over without losing an acknowledged commit.
func TestClusterPeerTLS(t *testing.T) {
	ca, other := txmqtest.NewCA(t, "cluster"), txmqtest.NewCA(t, "other")
	c := newCluster(t, 3, func(cfg *Config) {
		src := ca.Source(cfg.Raft.NodeID)
		cfg.TLS = src.ServerConfig(tls.RequireAndVerifyClientCert)
		cfg.Raft.PeerTLS = src.PeerConfig("")
	})
	follower := c.Follower().Node().ID()
	raftAddr := c.RaftAddr(follower)

	plain, err := net.DialTimeout("tcp", raftAddr, 5*time.Second)
	require.NoError(t, err)
	defer plain.Close()
	// An AppendEntries RPC's type byte and some of a request.
	_, err = plain.Write([]byte{0, 0x81, 0xa4, 'T', 'e', 'r', 'm', 1})
	require.NoError(t, err)
	requireClosed(t, plain)

	foreign := other.Client("intruder")
	foreign.InsecureSkipVerify = true
	d := tls.Dialer{Config: foreign}
	tc, err := d.DialContext(ctxT(t), "tcp", raftAddr)
	if err == nil {
		defer tc.Close()
		_, _ = tc.Write([]byte{0})
		requireClosed(t, tc)
	}

	testLeaderFailover(t, c, credentials.NewTLS(ca.Client("test")))
}

// requireClosed waits for the other side to close c.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "still open after 10s")
	require.Error(t, err)
}
