package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// testCA issues certificates for a test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T) *testCA {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &testCA{cert: cert, key: key}
}

// issue makes a certificate with the common name and DNS names.
func (ca *testCA) issue(t *testing.T, cn string, dns ...string) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn}, DNSNames: dns,
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// TestAuthClientCertificate: over a TLS server with the broker's auth
// interceptors, a verified certificate names the principal (by CN, or by
// a DNS SAN when the file says so); a certificate that names no principal,
// no certificate, and a wrong token beside a good certificate are
// Unauthenticated.
func TestAuthClientCertificate(t *testing.T) {
	for _, c := range []struct {
		identity, cn string
		dns          []string
	}{
		{"cn", "points.example", nil},
		{"dns", "ignored", []string{"points.example"}},
	} {
		t.Run(c.identity, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "auth.yaml")
			require.NoError(t, os.WriteFile(path, []byte(`cert_identity: `+c.identity+`
principals:
  - name: points
    certs: [points.example]
rules:
  - {who: [points], resources: [cluster], actions: [admin:read], decision: allow}
`), 0o600))
			tb := startBroker(t, func(cfg *Config) { cfg.AuthFile = path })
			ca := newTestCA(t)
			srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
				Certificates: []tls.Certificate{ca.issue(t, "broker")},
				ClientCAs:    ca.pool(), ClientAuth: tls.VerifyClientCertIfGiven,
			})), grpc.ChainUnaryInterceptor(tb.statusUnary, tb.auth.unary))
			txmqv1.RegisterAdminServiceServer(srv, &adminService{b: tb.Broker})
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			go srv.Serve(lis)
			t.Cleanup(srv.Stop)

			status := func(cert *tls.Certificate, md ...string) error {
				cfg := &tls.Config{RootCAs: ca.pool()}
				if cert != nil {
					cfg.Certificates = []tls.Certificate{*cert}
				}
				conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
				require.NoError(t, err)
				defer conn.Close()
				ctx := metadata.AppendToOutgoingContext(ctxT(t), md...)
				_, err = txmqv1.NewAdminServiceClient(conn).ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{Local: true})
				return err
			}
			good := ca.issue(t, c.cn, c.dns...)
			require.NoError(t, status(&good))
			// A token, when sent, decides: a wrong one is refused even
			// with a good certificate.
			err = status(&good, "authorization", "Bearer wrong")
			require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
			stranger := ca.issue(t, "stranger", "stranger.example")
			err = status(&stranger)
			require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
			require.ErrorContains(t, err, "names no principal")
			err = status(nil)
			require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
		})
	}
}
