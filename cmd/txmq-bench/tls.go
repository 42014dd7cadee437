package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/certgen"
	"github.com/txmq/txmq/internal/tlsconf"
)

// benchTLS is what --tls runs the brokers and clients with: throwaway
// certificates of one CA for n1..n3 and for the bench's clients; the
// brokers require client certificates and speak mutual TLS between them.
type benchTLS struct {
	nodes  map[string]certgen.Files
	client *tls.Config
}

func newBenchTLS(dir string) (*benchTLS, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ca, err := certgen.NewCA("txmq-bench CA")
	if err != nil {
		return nil, err
	}
	bt := &benchTLS{nodes: map[string]certgen.Files{}}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprint("n", i)
		if bt.nodes[id], err = ca.WriteFiles(dir, id, "127.0.0.1", "localhost"); err != nil {
			return nil, err
		}
	}
	certPEM, keyPEM, err := ca.Issue("bench")
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	bt.client = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, Certificates: []tls.Certificate{cert}}
	return bt, nil
}

// args are a broker process's TLS flags.
func (bt *benchTLS) args(id string) []string {
	f := bt.nodes[id]
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-client-ca", f.CA, "--tls-client-auth", "require"}
}

// configure sets an in-process broker's TLS as args sets a process's.
func (bt *benchTLS) configure(id string, cfg *broker.Config) error {
	src, err := tlsconf.Load(tlsconf.Files(bt.nodes[id]))
	if err != nil {
		return err
	}
	cfg.TLS = src.ServerConfig(tls.RequireAndVerifyClientCert)
	cfg.Raft.PeerTLS = src.PeerConfig("")
	return nil
}

// clientTLS is the clients' configuration: nil for plaintext.
func (bt *benchTLS) clientTLS() *tls.Config {
	if bt == nil {
		return nil
	}
	return bt.client
}
