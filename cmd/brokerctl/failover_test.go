package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/internal/txmqtest"
)

// The failover loop of issue 16, with real processes: three broker
// binaries, a loop of 200 `brokerctl --addr A,B,C send --key` runs of the
// brokerctl binary, the leader killed with SIGKILL during the loop and
// restarted later. Every send succeeds, and the topic holds each message
// once.
func TestClusterFailoverLoop(t *testing.T) { failoverLoop(t, nil, nil) }

// The failover loop over TLS: mutual TLS between the nodes (Raft and
// joining), client certificates required on the API, brokerctl with its
// --tls-* flags.
func TestClusterFailoverLoopTLS(t *testing.T) {
	ca := txmqtest.NewCA(t, "cluster")
	op := ca.Files("operator")
	failoverLoop(t, func(id string) []string {
		f := ca.Files(id)
		return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-client-ca", f.CA, "--tls-client-auth", "require"}
	}, []string{"--tls-ca", op.CA, "--tls-cert", op.Cert, "--tls-key", op.Key})
}

// failoverLoop runs the loop; nodeArgs, when set, adds to each broker's
// flags, and ctlArgs to each brokerctl run's.
func failoverLoop(t *testing.T, nodeArgs func(id string) []string, ctlArgs []string) {
	if testing.Short() {
		t.Skip("builds and runs the broker and brokerctl binaries")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	brokerBin := goBuild(t, ctx, filepath.Join(dir, "broker"), "../broker")
	ctlBin := goBuild(t, ctx, filepath.Join(dir, "brokerctl"), ".")

	var nodes []*brokerProc
	for i := 1; i <= 3; i++ {
		args := []string{"--data", filepath.Join(dir, fmt.Sprint("n", i)), "--node-id", fmt.Sprint("n", i),
			"--listen", "127.0.0.1:0", "--raft-listen", "127.0.0.1:0", "--metrics-listen", "", "--log-level", "warn"}
		if i > 1 {
			args = append(args, "--join", nodes[0].grpc)
		}
		if nodeArgs != nil {
			args = append(args, nodeArgs(fmt.Sprint("n", i))...)
		}
		nodes = append(nodes, startBrokerProc(t, brokerBin, args))
	}
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.grpc)
	}
	// ctlCmd is a brokerctl run; ctl runs one to its end.
	ctlCmd := func(args ...string) (cmd *exec.Cmd, stdout, stderr *bytes.Buffer) {
		global := append([]string{"--addr", strings.Join(addrs, ","), "--timeout", "30s"}, ctlArgs...)
		cmd = exec.CommandContext(ctx, ctlBin, append(global, args...)...)
		stdout, stderr = &bytes.Buffer{}, &bytes.Buffer{}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		return cmd, stdout, stderr
	}
	ctl := func(args ...string) (stdout, stderr string, err error) {
		cmd, out, errOut := ctlCmd(args...)
		err = cmd.Run()
		return out.String(), errOut.String(), err
	}
	leaderOf := func() *brokerProc {
		t.Helper()
		var st clusterJSON
		txmqtest.CheckFor(t, time.Minute, 100*time.Millisecond, func() error {
			out, stderr, err := ctl("cluster", "status", "-o", "json")
			if err != nil {
				return fmt.Errorf("%v: %s", err, stderr)
			}
			if err := json.Unmarshal([]byte(out), &st); err != nil {
				return err
			}
			reachable := 0
			for _, n := range st.Nodes {
				if n.Reachable && n.GrpcAddress != "" {
					reachable++
				}
			}
			if reachable != 3 || st.LeaderID == "" {
				return fmt.Errorf("%d of 3 nodes reachable, leader %q", reachable, st.LeaderID)
			}
			return nil
		})
		for _, n := range nodes {
			if n.grpc == st.LeaderAddress {
				return n
			}
		}
		t.Fatalf("the leader's address %s is none of %v", st.LeaderAddress, addrs)
		return nil
	}
	leader := leaderOf()

	const total, killAt, restartAt = 200, 50, 120
	sent := map[string]string{} // message ID -> body
	var slowest time.Duration
	slowestAt := 0
	for i := range total {
		if i == restartAt {
			<-leader.done
			leader = leader.restart(t)
		}
		body := fmt.Sprint("body-", i)
		began := time.Now()
		cmd, stdout, stderr := ctlCmd("send", "failover", body, "--key", fmt.Sprint("k-", i))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		if i == killAt {
			// SIGKILL, while this send is on its way.
			leader.kill(t)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("send %d failed: %v: %s", i, err, stderr)
		}
		out := stdout.String()
		if d := time.Since(began); d > slowest {
			slowest, slowestAt = d, i
		}
		id := strings.TrimSpace(out)
		if prev, ok := sent[id]; ok {
			t.Fatalf("send %d (%s) got the ID of %s: %s", i, body, prev, id)
		}
		sent[id] = body
	}
	t.Logf("the slowest send, %d, took %s (the leader was killed during send %d)", slowestAt, slowest, killAt)
	leaderOf()

	out, stderr, err := ctl("consume", "failover", "--group", "verify", "--count", fmt.Sprint(total+1), "--wait", "5s", "-o", "json")
	if err != nil {
		t.Fatalf("consume: %v: %s", err, stderr)
	}
	got := map[string]string{}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var d struct {
			ID   string `json:"id"`
			Body string `json:"body"`
		}
		if err := dec.Decode(&d); err != nil {
			t.Fatal(err)
		}
		if prev, ok := got[d.ID]; ok {
			t.Fatalf("message %s (%s) delivered twice, first as %s", d.ID, d.Body, prev)
		}
		got[d.ID] = d.Body
	}
	if len(got) != total {
		t.Fatalf("the topic holds %d messages, want %d", len(got), total)
	}
	for id, body := range sent {
		if got[id] != body {
			t.Errorf("message %s: sent %q, read %q", id, body, got[id])
		}
	}
}

// goBuild builds the main package in pkg into out.
func goBuild(t *testing.T, ctx context.Context, out, pkg string) string {
	t.Helper()
	b, err := exec.CommandContext(ctx, "go", "build", "-o", out, pkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// brokerProc is a broker process, with the addresses it bound.
type brokerProc struct {
	bin, grpc, raft string
	args            []string
	cmd             *exec.Cmd
	done            chan struct{} // closed once it exited
}

var boundRE = regexp.MustCompile(`gRPC on (\S+), Raft on (\S+),`)

// startBrokerProc starts the broker binary and waits until it says which
// addresses it bound and that it is ready.
func startBrokerProc(t *testing.T, bin string, args []string) *brokerProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &brokerProc{bin: bin, args: args, cmd: cmd, done: make(chan struct{})}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(p.done)
	}()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("broker %v exited before it was ready", args)
			}
			if m := boundRE.FindStringSubmatch(l); m != nil {
				p.grpc, p.raft = m[1], m[2]
			}
			if strings.HasPrefix(l, "ready:") && p.grpc != "" {
				return p
			}
		case <-deadline:
			t.Fatalf("broker %v not ready within 60s", args)
		}
	}
}

// kill sends SIGKILL to the process, by its PID.
func (p *brokerProc) kill(t *testing.T) {
	if err := p.cmd.Process.Kill(); err != nil {
		t.Errorf("kill -9 of the broker at %s: %v", p.grpc, err)
	}
}

// restart starts the broker again on its data and the addresses it bound
// the first time, which the other members know it by.
func (p *brokerProc) restart(t *testing.T) *brokerProc {
	t.Helper()
	args := append([]string(nil), p.args...)
	for i, a := range args {
		switch a {
		case "--listen":
			args[i+1] = p.grpc
		case "--raft-listen":
			args[i+1] = p.raft
		}
	}
	return startBrokerProc(t, p.bin, args)
}
