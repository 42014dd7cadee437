package txmqtest

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/txmq/txmq/internal/certgen"
	"github.com/txmq/txmq/internal/tlsconf"
)

// CA is a throwaway certificate authority for a test.
type CA struct {
	*certgen.CA
	t testing.TB
}

// NewCA makes a CA named name.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := certgen.NewCA(name)
	if err != nil {
		t.Fatalf("txmqtest: %v", err)
	}
	return &CA{CA: ca, t: t}
}

// Files issues a certificate for name, valid for 127.0.0.1 and localhost,
// and writes it, its key and the CA into a new directory.
func (ca *CA) Files(name string) tlsconf.Files {
	ca.t.Helper()
	f, err := ca.WriteFiles(ca.t.TempDir(), name, "127.0.0.1", "localhost")
	if err != nil {
		ca.t.Fatalf("txmqtest: %v", err)
	}
	return tlsconf.Files(f)
}

// Source reads the files of a new certificate for name.
func (ca *CA) Source(name string) *tlsconf.Source {
	ca.t.Helper()
	src, err := tlsconf.Load(ca.Files(name))
	if err != nil {
		ca.t.Fatalf("txmqtest: %v", err)
	}
	return src
}

// Client is a client's TLS configuration: servers verified against this
// CA, and a certificate for name presented when name is not empty.
func (ca *CA) Client(name string) *tls.Config {
	ca.t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	conf := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if name != "" {
		certPEM, keyPEM, err := ca.Issue(name)
		if err != nil {
			ca.t.Fatalf("txmqtest: %v", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			ca.t.Fatalf("txmqtest: %v", err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf
}
