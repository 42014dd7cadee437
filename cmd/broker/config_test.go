package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
)

func noEnv(string) (string, bool) { return "", false }

// envOf looks variables up in m.
func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// parseWith does what run does before it opens the broker.
func parseWith(args []string, env map[string]string) (broker.Config, error) {
	fs, v := newFlagSet(io.Discard)
	if err := fs.Parse(args); err != nil {
		return broker.Config{}, err
	}
	if err := applySources(fs, envOf(env)); err != nil {
		return broker.Config{}, err
	}
	return v.config(fs, io.Discard)
}

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "txmq.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	return path
}

// TestConfigExampleFile loads deploy/txmq.yaml, which sets every flag,
// and checks that docs/operations.md shows it as it is.
func TestConfigExampleFile(t *testing.T) {
	const path = "../../deploy/txmq.yaml"
	example, err := os.ReadFile(path)
	require.NoError(t, err)
	fs, _ := newFlagSet(io.Discard)
	settings, err := readConfigFile(path, fs)
	require.NoError(t, err)
	keys := map[string]bool{}
	for _, s := range settings {
		keys[s.name] = true
	}
	fs.VisitAll(func(f *flag.Flag) {
		require.True(t, keys[f.Name] || commandLineOnly[f.Name], "deploy/txmq.yaml lacks %s", f.Name)
	})

	cfg, err := parseWith([]string{"--config", path}, nil)
	require.NoError(t, err)
	def, err := parseWith([]string{"--data", "/var/lib/txmq"}, nil)
	require.NoError(t, err)
	cfg.Logger, def.Logger = nil, nil
	require.Equal(t, def, cfg, "the example's values are the defaults")

	ops, err := os.ReadFile("../../docs/operations.md")
	require.NoError(t, err)
	require.Contains(t, string(ops), string(example), "docs/operations.md shows deploy/txmq.yaml verbatim")
}

func TestConfigPrecedence(t *testing.T) {
	path := writeConfig(t, strings.Join([]string{
		"listen: 127.0.0.1:1111",
		"ack-deadline: 40s",
		"max-checks: 7",
		"peers: [n1=127.0.0.1:1, n2=127.0.0.1:2]",
		"expiry-action: rollback",
		"metrics-listen: 127.0.0.1:3333",
	}, "\n"))
	env := map[string]string{
		"TXMQ_CONFIG":         path,
		"TXMQ_LISTEN":         "127.0.0.1:2222",
		"TXMQ_MAX_CHECKS":     "8",
		"TXMQ_METRICS_LISTEN": "",
		"TXMQ_ADDR":           "ignored: brokerctl's",
	}
	cfg, err := parseWith([]string{"--max-checks", "9"}, env)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1:2222", cfg.GRPCAddr, "the variable wins over the file")
	require.Equal(t, uint32(9), cfg.CheckBack.Policy.MaxChecks, "the flag wins over both")
	require.Equal(t, 40*time.Second, cfg.AckDeadline, "the file wins over the default")
	require.Len(t, cfg.Raft.Peers, 2)
	require.True(t, cfg.CheckBack.Policy.Rollback)
	require.Empty(t, cfg.MetricsAddr, "an empty variable turns metrics off")
	require.Equal(t, checkback.DefaultBackoff, cfg.CheckBack.Policy.Backoff, "the default where nothing sets it")

	cfg, err = parseWith([]string{"--config", path}, map[string]string{"TXMQ_CONFIG": "/nonexistent"})
	require.NoError(t, err, "--config wins over TXMQ_CONFIG")
	require.Equal(t, "127.0.0.1:1111", cfg.GRPCAddr)
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{name: "unknown key", file: "listen: 127.0.0.1:1\nlisten-addr: x\n", want: `txmq.yaml:2: unknown key "listen-addr"`},
		{name: "command-line only key", file: "version: true\n", want: `txmq.yaml:1: unknown key "version"`},
		{name: "out of bounds", file: "\nmax-checks: 0\n", want: "txmq.yaml:2: max-checks: --max-checks 0 is outside 1..1000"},
		{name: "not a duration", file: "ack-deadline: soon\n", want: `txmq.yaml:1: ack-deadline: time: invalid duration "soon"`},
		{name: "duplicate", file: "data: a\ndata: b\n", want: `txmq.yaml:2: key "data" again (first on line 1)`},
		{name: "nested", file: "data:\n  dir: a\n", want: "txmq.yaml:2: data: want a value or a list of values"},
		{name: "not a mapping", file: "- data\n", want: "txmq.yaml:1: want a mapping"},
		{name: "not YAML", file: "data: [a\n", want: "txmq.yaml: yaml: line"},
		{name: "bad variable", env: map[string]string{"TXMQ_ACK_DEADLINE": "1ns"}, want: "TXMQ_ACK_DEADLINE: --ack-deadline 1ns is outside"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var args []string
			if tc.file != "" {
				args = []string{"--config", writeConfig(t, tc.file)}
			}
			_, err := parseWith(args, tc.env)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := parseWith([]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, nil)
	require.ErrorContains(t, err, "--config: open")
}

// TestRunConfigUsageError: run reports a bad file as a usage error (2)
// before it opens anything.
func TestRunConfigUsageError(t *testing.T) {
	var out, errOut bytes.Buffer
	path := writeConfig(t, "retention: 1ms\n")
	require.Equal(t, 2, run([]string{"--config", path}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "txmq.yaml:1: retention: --retention 1ms is outside")
}

func TestVersionFlag(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"--version"}, noEnv, &out, &errOut))
	require.Regexp(t, `^broker \S+ .*go1\.\d+`, out.String())
	require.Empty(t, errOut.String())
}
