package main

import (
	"crypto/tls"
	"strings"
	"testing"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/txmqtest"
)

// brokerctl's --tls-* flags, directly and from a saved context, against a
// real broker that requires client certificates.
func TestTLSFlagsAndContext(t *testing.T) {
	ca := txmqtest.NewCA(t, "txmq")
	addr := startRealBrokerWith(t, func(cfg *broker.Config) {
		cfg.TLS = ca.Source("broker").ServerConfig(tls.RequireAndVerifyClientCert)
	})
	client := ca.Files("operator")
	tlsArgs := []string{"--tls-ca", client.CA, "--tls-cert", client.Cert, "--tls-key", client.Key}

	wantOK(t, brokerctl(t, nil, append([]string{"--addr", addr, "cluster", "status"}, tlsArgs...)...))
	r := brokerctl(t, nil, "--addr", addr, "--timeout", "2s", "--tls-ca", client.CA, "cluster", "status")
	if r.code == exitOK {
		t.Fatal("served without a client certificate")
	}
	r = brokerctl(t, nil, "--addr", addr, "--tls-cert", client.Cert, "cluster", "status")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--tls-cert and --tls-key go together") {
		t.Fatalf("a certificate without its key: exit %d, %q", r.code, r.stderr)
	}

	env := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	wantOK(t, brokerctl(t, env, append([]string{"context", "add", "prod", "--addr", addr, "--use"}, tlsArgs...)...))
	r = brokerctl(t, env, "cluster", "status")
	wantOK(t, r)
	if !strings.Contains(r.stdout, "n1") {
		t.Fatalf("cluster status through the context printed:\n%s", r.stdout)
	}
}
