package main

import (
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/crypto/bcrypt"

	"github.com/txmq/txmq/broker"
)

// benchAuth is what --auth runs the brokers and clients with: an auth
// file of two principals, bench (the workloads' clients: publish,
// transact and subscribe on the bench's topics and groups, admin:read for
// the checkback workload's polling) and node (the brokers' calls to each
// other), each with a random token kept as a bcrypt hash of the default
// cost, as brokerctl auth hash makes it.
type benchAuth struct {
	file, token, peerToken string
}

const benchRules = `
rules:
  - who: [bench]
    resources: ["topic:bench-*", "producer-group:bench*", "consumer-group:bench-*"]
    actions: [publish, transact, subscribe, admin:read]
    decision: allow
  - who: [node]
    resources: [cluster]
    actions: [admin:read, admin:write]
    decision: allow
`

func newBenchAuth(dir string) (*benchAuth, error) {
	ba := &benchAuth{file: filepath.Join(dir, "auth.yaml"), token: rand.Text(), peerToken: rand.Text()}
	file := "principals:\n"
	for _, p := range []struct{ name, token string }{{"bench", ba.token}, {"node", ba.peerToken}} {
		h, err := bcrypt.GenerateFromPassword([]byte(p.token), bcrypt.DefaultCost)
		if err != nil {
			return nil, err
		}
		file += fmt.Sprintf("  - name: %s\n    token_hash: %q\n", p.name, h)
	}
	if err := os.WriteFile(ba.file, []byte(file+benchRules), 0o600); err != nil {
		return nil, err
	}
	return ba, nil
}

// args are a broker process's auth flags.
func (ba *benchAuth) args() []string {
	return []string{"--auth-file", ba.file, "--peer-token", ba.peerToken}
}

// configure sets an in-process broker's auth as args sets a process's.
func (ba *benchAuth) configure(cfg *broker.Config) {
	cfg.AuthFile, cfg.PeerToken = ba.file, ba.peerToken
}

// clientToken is the clients' token: "" without auth.
func (ba *benchAuth) clientToken() string {
	if ba == nil {
		return ""
	}
	return ba.token
}
