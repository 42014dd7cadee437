package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txmq/txmq/broker"
)

// TestAuthToken runs brokerctl against a broker with an auth file: the
// hash brokerctl auth hash prints is what the file takes; without a token
// a command is refused as unauthenticated; --token, TXMQ_TOKEN and a saved
// context carry it; an operator without admin:write cannot purge.
func TestAuthToken(t *testing.T) {
	hash := func(token string) string {
		r := brokerctl(t, nil, "auth", "hash", token)
		wantOK(t, r)
		h, ok := strings.CutPrefix(strings.TrimSpace(r.stdout), "token_hash: ")
		if !ok {
			t.Fatalf("auth hash printed %q", r.stdout)
		}
		return h
	}
	path := filepath.Join(t.TempDir(), "auth.yaml")
	file := `principals:
  - {name: ops, token_hash: ` + hash("ops-secret") + `}
  - {name: reader, token_hash: ` + hash("reader-secret") + `}
rules:
  - {who: [ops], resources: ["*"], actions: [admin:read, admin:write], decision: allow}
  - {who: [reader], resources: ["*"], actions: [admin:read], decision: allow}
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	b := realBroker(t, func(c *broker.Config) { c.AuthFile = path })

	r := brokerctl(t, nil, "--addr", b.Addr(), "topic", "list")
	if r.code != exitFailure || !strings.Contains(r.stderr, "credentials required") {
		t.Fatalf("without a token: exit %d, stderr %q", r.code, r.stderr)
	}
	r = brokerctl(t, nil, "--addr", b.Addr(), "--token", "wrong", "topic", "list")
	if r.code != exitFailure || !strings.Contains(r.stderr, "not valid") {
		t.Fatalf("wrong token: exit %d, stderr %q", r.code, r.stderr)
	}
	wantOK(t, brokerctl(t, nil, "--addr", b.Addr(), "--token", "ops-secret", "topic", "create", "orders"))
	wantOK(t, brokerctl(t, map[string]string{"TXMQ_TOKEN": "reader-secret"}, "--addr", b.Addr(), "topic", "list"))

	r = brokerctl(t, map[string]string{"TXMQ_TOKEN": "reader-secret"}, "--addr", b.Addr(), "dlq", "purge", "points", "--all", "-f")
	if r.code != exitFailure || !strings.Contains(r.stderr, `principal "reader" may not admin:write on consumer-group:points`) {
		t.Fatalf("purge without admin:write: exit %d, stderr %q", r.code, r.stderr)
	}

	env := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	wantOK(t, brokerctl(t, env, "context", "add", "prod", "--addr", b.Addr(), "--token", "ops-secret", "--use"))
	wantOK(t, brokerctl(t, env, "group", "create", "points", "--topic", "orders"))
	r = brokerctl(t, env, "context", "ls", "-o", "json")
	wantOK(t, r)
	if strings.Contains(r.stdout, "ops-secret") {
		t.Fatalf("context ls shows the token: %s", r.stdout)
	}
}
