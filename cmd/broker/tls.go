package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/internal/tlsconf"
)

// tlsFlags are the transport security flags (docs/security.md).
type tlsFlags struct {
	cert, key, clientCA, clientAuth       *string
	peerCert, peerKey, peerCA, peerName   *string
	callbackCA, callbackCert, callbackKey *string
	insecure                              *bool
	// sources are the files read, watched by serve once the broker runs.
	sources []*tlsconf.Source
}

// certPollInterval is how often the certificate files are looked at for
// changes; SIGHUP reads them at once.
const certPollInterval = 10 * time.Second

func newTLSFlags(fs *flag.FlagSet) *tlsFlags {
	return &tlsFlags{
		cert:         fs.String("tls-cert", "", "PEM certificate the client API serves TLS with (with --tls-key); read again when the file changes or on SIGHUP"),
		key:          fs.String("tls-key", "", "PEM private key of --tls-cert"),
		clientCA:     fs.String("tls-client-ca", "", "PEM CA bundle that client certificates are verified against (with --tls-client-auth request or require)"),
		clientAuth:   fs.String("tls-client-auth", "none", "client certificates on the API: none, request (verified when given) or require"),
		peerCert:     fs.String("peer-tls-cert", "", "PEM certificate of this node for mutual TLS with the other nodes, on the Raft port and node-to-node gRPC (default: --tls-cert)"),
		peerKey:      fs.String("peer-tls-key", "", "PEM private key of --peer-tls-cert (default: --tls-key)"),
		peerCA:       fs.String("peer-tls-ca", "", "PEM CA bundle of the cluster: a peer must present a certificate it signed (default: --tls-client-ca)"),
		peerName:     fs.String("peer-tls-name", "", "when set, a peer's certificate must also carry this name as its subject CN or a DNS SAN"),
		callbackCA:   fs.String("callback-ca", "", "PEM CA bundle that HTTPS and gRPC check-back endpoints are verified against; when set, gRPC endpoints are called over TLS (default: the system's roots, gRPC in plaintext)"),
		callbackCert: fs.String("callback-tls-cert", "", "PEM client certificate presented to check-back endpoints that ask for one (mTLS)"),
		callbackKey:  fs.String("callback-tls-key", "", "PEM private key of --callback-tls-cert"),
		insecure:     fs.Bool("insecure", false, "allow --listen or --raft-listen off loopback without TLS (plaintext anyone on the network can read and speak)"),
	}
}

// configure sets cfg's TLS from the flags and refuses plaintext off
// loopback unless --insecure.
func (f *tlsFlags) configure(cfg *broker.Config) error {
	if *f.cert != "" || *f.key != "" {
		auth, err := tlsconf.ParseClientAuth(*f.clientAuth)
		if err != nil {
			return fmt.Errorf("--tls-client-auth %w", err)
		}
		if auth != tls.NoClientCert && *f.clientCA == "" {
			return fmt.Errorf("--tls-client-auth %s needs --tls-client-ca, the CA that signs client certificates", *f.clientAuth)
		}
		api, err := f.load(tlsconf.Files{Cert: *f.cert, Key: *f.key, CA: *f.clientCA})
		if err != nil {
			return err
		}
		cfg.TLS = api.ServerConfig(auth)
	}
	peer := tlsconf.Files{Cert: or(*f.peerCert, *f.cert), Key: or(*f.peerKey, *f.key), CA: or(*f.peerCA, *f.clientCA)}
	explicit := *f.peerCert != "" || *f.peerKey != "" || *f.peerCA != ""
	switch {
	case peer.Cert != "" && peer.CA != "":
		src, err := f.load(peer)
		if err != nil {
			return err
		}
		cfg.Raft.PeerTLS = src.PeerConfig(*f.peerName)
	case explicit:
		return errors.New("peer TLS needs a certificate and key (--peer-tls-cert/--peer-tls-key, or --tls-cert/--tls-key) and the cluster's CA (--peer-tls-ca, or --tls-client-ca)")
	}
	if cfg.TLS != nil && cfg.Raft.PeerTLS == nil && (len(cfg.Join) > 0 || len(cfg.Raft.Peers) > 1) {
		return errors.New("the nodes of a cluster call each other's TLS API with their certificates: give the cluster's CA (--peer-tls-ca, or --tls-client-ca)")
	}
	if *f.callbackCA != "" || *f.callbackCert != "" || *f.callbackKey != "" {
		src, err := f.load(tlsconf.Files{Cert: *f.callbackCert, Key: *f.callbackKey, CA: *f.callbackCA})
		if err != nil {
			return err
		}
		cfg.CheckBack.TLS = src.ClientConfig()
	}
	if *f.insecure {
		return nil
	}
	if cfg.TLS == nil && !loopback.Addr(cfg.GRPCAddr) {
		return fmt.Errorf("--listen %s is not a loopback address and the API has no TLS: give --tls-cert and --tls-key (docs/security.md), or --insecure to serve plaintext anyway", cfg.GRPCAddr)
	}
	if cfg.Raft.PeerTLS == nil && !loopback.Addr(cfg.Raft.RaftAddr) {
		return fmt.Errorf("--raft-listen %s is not a loopback address and the nodes speak without TLS: give --peer-tls-cert, --peer-tls-key and --peer-tls-ca (docs/security.md), or --insecure to run Raft in plaintext anyway", cfg.Raft.RaftAddr)
	}
	return nil
}

// load reads files, once for the API and the peers when they share them.
func (f *tlsFlags) load(files tlsconf.Files) (*tlsconf.Source, error) {
	for _, s := range f.sources {
		if s.Files() == files {
			return s, nil
		}
	}
	src, err := tlsconf.Load(files)
	if err != nil {
		return nil, err
	}
	f.sources = append(f.sources, src)
	return src, nil
}

// watch reads the certificate files again when they change or on SIGHUP,
// until ctx ends. SIGHUP is caught from the call on, so that one sent as
// soon as the broker says it is ready reads the files instead of ending
// the process; without certificate files it keeps its default.
func (f *tlsFlags) watch(ctx context.Context, log *slog.Logger) {
	if len(f.sources) == 0 {
		return
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		defer signal.Stop(hup)
		tlsconf.Watch(ctx, certPollInterval, hup, log, f.sources...)
	}()
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}
