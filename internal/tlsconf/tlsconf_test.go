package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"

	"github.com/txmq/txmq/internal/certgen"
)

func newFiles(t *testing.T, ca *certgen.CA, name string) Files {
	t.Helper()
	f, err := ca.WriteFiles(t.TempDir(), name, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	return Files(f)
}

func newCA(t *testing.T, name string) *certgen.CA {
	t.Helper()
	ca, err := certgen.NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func leafName(t *testing.T, s *Source) string {
	t.Helper()
	conf, err := s.ServerConfig(tls.NoClientCert).GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(conf.Certificates[0].Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	return leaf.Subject.CommonName
}

// A file that does not parse keeps the old certificate; a good one
// replaces it, and an unchanged file is not read again.
func TestReloadKeepsTheOldOnError(t *testing.T) {
	ca := newCA(t, "ca")
	f := newFiles(t, ca, "first")
	s, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Reload(); changed || err != nil {
		t.Fatalf("unchanged files: changed %v, err %v", changed, err)
	}
	if err := os.WriteFile(f.Cert, []byte("half a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	if !s.Changed() {
		t.Fatal("a rewritten file is not seen as changed")
	}
	if _, err := s.Reload(); err == nil {
		t.Fatal("a broken certificate file read without an error")
	}
	if got := leafName(t, s); got != "first" {
		t.Fatalf("after a failed reading the server presents %q, want the old certificate", got)
	}
	certPEM, keyPEM, err := ca.Issue("second")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Key, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.Cert, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := s.Reload(); !changed || err != nil {
		t.Fatalf("new files: changed %v, err %v", changed, err)
	}
	if got := leafName(t, s); got != "second" {
		t.Fatalf("the server presents %q, want second", got)
	}
}

// A peer passes only with a certificate of the cluster's CA and, when a
// name is asked for, that name.
func TestPeerVerification(t *testing.T) {
	ca, other := newCA(t, "cluster"), newCA(t, "other")
	s, err := Load(newFiles(t, ca, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	cert := func(ca *certgen.CA, name string) []*x509.Certificate {
		certPEM, keyPEM, err := ca.Issue(name)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return []*x509.Certificate{leaf}
	}
	for _, tc := range []struct {
		what  string
		certs []*x509.Certificate
		name  string
		ok    bool
	}{
		{"a node of the cluster", cert(ca, "n2"), "", true},
		{"no certificate", nil, "", false},
		{"another CA", cert(other, "n2"), "", false},
		{"the asked-for name", cert(ca, "txmq-peer"), "txmq-peer", true},
		{"another name", cert(ca, "n2"), "txmq-peer", false},
	} {
		if err := s.verifyPeer(tc.certs, tc.name); (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.what, err, tc.ok)
		}
	}
}

func TestParseClientAuth(t *testing.T) {
	for in, want := range map[string]tls.ClientAuthType{"none": tls.NoClientCert, "request": tls.VerifyClientCertIfGiven, "require": tls.RequireAndVerifyClientCert} {
		if got, err := ParseClientAuth(in); err != nil || got != want {
			t.Errorf("%s: %v, %v", in, got, err)
		}
	}
	if _, err := ParseClientAuth("always"); err == nil {
		t.Error("always: no error")
	}
}
