package main

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/txmqtest"
	"github.com/txmq/txmq/raftlog"
)

// brokerctl's --tls-* flags, directly and from a saved context, against a
// real broker that requires client certificates.
func TestTLSFlagsAndContext(t *testing.T) {
	ca := txmqtest.NewCA(t, "txmq")
	b, err := broker.Open(broker.Config{
		Raft:     raftlog.Config{NodeID: "n1", Dir: t.TempDir(), Listener: txmqtest.Listen(t), Bootstrap: true},
		GRPCAddr: "127.0.0.1:0",
		TLS:      ca.Source("broker").ServerConfig(tls.RequireAndVerifyClientCert),
		Logger:   txmqtest.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	client := ca.Files("operator")
	tlsArgs := []string{"--tls-ca", client.CA, "--tls-cert", client.Cert, "--tls-key", client.Key}

	wantOK(t, brokerctl(t, nil, append([]string{"--addr", b.Addr(), "cluster", "status"}, tlsArgs...)...))
	r := brokerctl(t, nil, "--addr", b.Addr(), "--timeout", "2s", "--tls-ca", client.CA, "cluster", "status")
	if r.code == exitOK {
		t.Fatal("served without a client certificate")
	}
	r = brokerctl(t, nil, "--addr", b.Addr(), "--tls-cert", client.Cert, "cluster", "status")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--tls-cert and --tls-key go together") {
		t.Fatalf("a certificate without its key: exit %d, %q", r.code, r.stderr)
	}

	env := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	wantOK(t, brokerctl(t, env, append([]string{"context", "add", "prod", "--addr", b.Addr(), "--use"}, tlsArgs...)...))
	r = brokerctl(t, env, "cluster", "status")
	wantOK(t, r)
	if !strings.Contains(r.stdout, "n1") {
		t.Fatalf("cluster status through the context printed:\n%s", r.stdout)
	}
}
