// Package tlsconf builds the TLS configurations of txmq's listeners and
// dialers from PEM files: the client API's server side, mutual TLS
// between nodes, and the check-back caller's client side. A Source holds
// the files' current contents and swaps them atomically when they are
// read again, so new handshakes use new certificates while established
// connections carry on.
package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"
)

// Files are a certificate, its key and a CA bundle, each optional: a
// server needs Cert and Key, verifying the other side needs CA.
type Files struct {
	Cert, Key, CA string
}

// Source is the contents of Files, read again by Reload.
type Source struct {
	files Files
	cur   atomic.Pointer[material]
}

// material is one reading of the files.
type material struct {
	cert *tls.Certificate
	pool *x509.CertPool
	// stamps are the files' modification times and sizes when read.
	stamps []stamp
}

type stamp struct {
	mod  time.Time
	size int64
}

// Load reads files. Cert and Key go together.
func Load(files Files) (*Source, error) {
	if (files.Cert == "") != (files.Key == "") {
		return nil, fmt.Errorf("tls: a certificate (%q) needs its key (%q) and the other way round", files.Cert, files.Key)
	}
	s := &Source{files: files}
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Files are the files s reads.
func (s *Source) Files() Files { return s.files }

// Reload reads the files again. On an error it keeps what it had and
// says why; otherwise it reports whether anything changed on disk.
func (s *Source) Reload() (bool, error) {
	m := &material{stamps: s.stamps()}
	if old := s.cur.Load(); old != nil && slices.Equal(old.stamps, m.stamps) {
		return false, nil
	}
	if s.files.Cert != "" {
		cert, err := tls.LoadX509KeyPair(s.files.Cert, s.files.Key)
		if err != nil {
			return false, fmt.Errorf("tls: %s, %s: %w", s.files.Cert, s.files.Key, err)
		}
		m.cert = &cert
	}
	if s.files.CA != "" {
		data, err := os.ReadFile(s.files.CA)
		if err != nil {
			return false, fmt.Errorf("tls: %w", err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(data) {
			return false, fmt.Errorf("tls: %s: no PEM certificate in it", s.files.CA)
		}
	}
	s.cur.Store(m)
	return true, nil
}

// Changed says whether a file's modification time or size differs from
// the last reading: cheap enough to poll.
func (s *Source) Changed() bool {
	return !slices.Equal(s.cur.Load().stamps, s.stamps())
}

func (s *Source) stamps() []stamp {
	var out []stamp
	for _, p := range []string{s.files.Cert, s.files.Key, s.files.CA} {
		if p == "" {
			continue
		}
		var st stamp
		if fi, err := os.Stat(p); err == nil {
			st = stamp{mod: fi.ModTime(), size: fi.Size()}
		}
		out = append(out, st)
	}
	return out
}

// ParseClientAuth reads --tls-client-auth: none (no client certificate
// asked for), request (verified when one is given) or require.
func ParseClientAuth(s string) (tls.ClientAuthType, error) {
	switch s {
	case "none":
		return tls.NoClientCert, nil
	case "request":
		return tls.VerifyClientCertIfGiven, nil
	case "require":
		return tls.RequireAndVerifyClientCert, nil
	}
	return 0, fmt.Errorf("%q: use none, request or require", s)
}

// ServerConfig is the client API's server side: the current certificate
// and, unless auth is tls.NoClientCert, client certificates verified
// against the current CA bundle.
func (s *Source) ServerConfig(auth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.cur.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				ClientCAs:    m.pool,
				ClientAuth:   auth,
				NextProtos:   []string{"h2"},
			}, nil
		},
	}
}

// PeerConfig is mutual TLS between nodes, for both ends of a connection:
// each side presents the current certificate and accepts the other's
// only if the current CA bundle signed it and, when name is set, it
// carries name as its subject CN or a DNS SAN. Peers are reached at
// addresses, not host names, so the chain and the name are checked here
// instead of by crypto/tls's host name verification.
func (s *Source) PeerConfig(name string) *tls.Config {
	current := func() (*tls.Certificate, error) { return s.cur.Load().cert, nil }
	return &tls.Config{
		MinVersion:           tls.VersionTLS12,
		GetCertificate:       func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return current() },
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return current() },
		ClientAuth:           tls.RequireAnyClientCert,
		InsecureSkipVerify:   true, // VerifyConnection checks the chain and the name
		VerifyConnection:     func(cs tls.ConnectionState) error { return s.verifyPeer(cs.PeerCertificates, name) },
	}
}

// ErrPeerRefused wraps every reason a peer's certificate is refused for.
var ErrPeerRefused = errors.New("tls: peer refused")

func (s *Source) verifyPeer(certs []*x509.Certificate, name string) error {
	if len(certs) == 0 {
		return fmt.Errorf("%w: no certificate", ErrPeerRefused)
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	opts := x509.VerifyOptions{Roots: s.cur.Load().pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if _, err := leaf.Verify(opts); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrPeerRefused, leaf.Subject.CommonName, err)
	}
	if name != "" && leaf.Subject.CommonName != name && !slices.Contains(leaf.DNSNames, name) {
		return fmt.Errorf("%w: %s does not carry the name %q", ErrPeerRefused, leaf.Subject.CommonName, name)
	}
	return nil
}

// ClientConfig is a client's side (the check-back caller's): servers
// verified against the CA bundle (the system's when there is none), and
// the current certificate presented when the server asks for one.
func (s *Source) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		RootCAs:    s.cur.Load().pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if c := s.cur.Load().cert; c != nil {
				return c, nil
			}
			return &tls.Certificate{}, nil
		},
	}
}
