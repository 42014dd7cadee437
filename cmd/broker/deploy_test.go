package main

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const unitPath = "../../deploy/txmq.service"

// readUnit reads a systemd unit as section -> key -> values (a key may
// repeat).
func readUnit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string]map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			out[section] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			require.True(t, ok, "%s: %q is no key=value", path, line)
			require.NotEmpty(t, section, "%s: %q before any section", path, line)
			out[section][k] = append(out[section][k], v)
		}
	}
	require.NoError(t, sc.Err())
	return out
}

// The unit runs the broker as a user of its own with its state directory,
// restarts it on failure, stops it with SIGTERM and waits longer than the
// leadership hand-over, and starts it with flags the broker has.
func TestSystemdUnit(t *testing.T) {
	unit := readUnit(t, unitPath)
	svc := unit["Service"]
	one := func(k string) string {
		require.Len(t, svc[k], 1, "Service.%s", k)
		return svc[k][0]
	}
	require.True(t, one("DynamicUser") == "yes" || len(svc["User"]) == 1, "a user of its own")
	require.Equal(t, "txmq", one("StateDirectory"))
	require.Equal(t, "on-failure", one("Restart"))
	require.Equal(t, "SIGTERM", one("KillSignal"))
	require.NotEmpty(t, one("LimitNOFILE"))
	stop, err := time.ParseDuration(one("TimeoutStopSec"))
	require.NoError(t, err)
	require.Greater(t, stop, handOverTimeout, "the stop timeout leaves room for the hand-over")
	require.Equal(t, []string{"multi-user.target"}, unit["Install"]["WantedBy"])

	execStart := strings.Fields(one("ExecStart"))
	require.Equal(t, "broker", filepath.Base(execStart[0]))
	fs, v := newFlagSet(io.Discard)
	require.NoError(t, fs.Parse(execStart[1:]), "ExecStart's flags are the broker's")
	require.Zero(t, fs.NArg())
	require.Equal(t, "/var/lib/txmq", *v.data, "the data is in the StateDirectory")
	require.NotEmpty(t, *v.configFile)
}

// systemd-analyze verify accepts the unit, with ExecStart pointing at a
// broker built for the test (verify wants the binary to exist).
func TestSystemdAnalyzeVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze on this machine")
	}
	raw, err := os.ReadFile(unitPath)
	require.NoError(t, err)
	bin := brokerBin(t)
	unit := filepath.Join(t.TempDir(), "txmq.service")
	require.NoError(t, os.WriteFile(unit, []byte(strings.Replace(string(raw), "ExecStart=/usr/local/bin/broker", "ExecStart="+bin, 1)), 0o600))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, analyze, "verify", unit).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "txmq.service:", "no warning about the unit: %s", out)
}

// The image builds where a container tool and its daemon are there.
func TestDockerImageBuilds(t *testing.T) {
	var tool string
	for _, name := range []string{"docker", "podman"} {
		if p, err := exec.LookPath(name); err == nil {
			tool = p
			break
		}
	}
	if tool == "" {
		t.Skip("no docker or podman on this machine: the image is not built")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, tool, "info").CombinedOutput(); err != nil {
		t.Skipf("%s cannot reach its daemon, the image is not built: %v: %.200s", tool, err, out)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	tag := "txmq-test:" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	build := exec.CommandContext(ctx, tool, "build", "-f", "deploy/Dockerfile", "-t", tag, ".")
	build.Dir = "../.."
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, exec.Command(tool, "rmi", tag).Run())
}
