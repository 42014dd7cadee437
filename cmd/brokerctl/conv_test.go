package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/syncbuf"
	"github.com/txmq/txmq/internal/txmqtest"
)

func TestVersion(t *testing.T) {
	r := brokerctl(t, nil, "--version")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, "brokerctl ") || !strings.Contains(r.stdout, " go1.") || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("--version printed %q", r.stdout)
	}
}

// A usage error is one line saying what is wrong and one with the
// synopsis and where the flags are, not the whole flag list; help CMD
// prints that list on stdout.
func TestUsageErrorIsTwoLines(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		want, hint string
	}{
		{[]string{"send", "orders"}, "brokerctl send: want 2 argument(s), TOPIC BODY; got 1", "usage: brokerctl send TOPIC BODY|- [--key K]"},
		{[]string{"half", "list", "--bogus"}, "brokerctl half list: flag provided but not defined: -bogus", "run 'brokerctl help half list' for its flags"},
		{[]string{"bogus"}, `brokerctl: unknown command "bogus"`, "run 'brokerctl help' for the commands"},
		{[]string{"--bogus", "send"}, "brokerctl: flag provided but not defined: -bogus", "run 'brokerctl help' for the commands"},
		{[]string{"help", "half", "bogus"}, `brokerctl: help: unknown command "half bogus"`, "usage: brokerctl [global flags]"},
	} {
		r := brokerctl(t, nil, tc.args...)
		lines := strings.Split(strings.TrimSuffix(r.stderr, "\n"), "\n")
		if r.code != exitUsage || len(lines) != 2 || lines[0] != tc.want || !strings.Contains(lines[1], tc.hint) || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want 2 and the lines %q, ...%q...", tc.args, r.code, r.stdout, r.stderr, tc.want, tc.hint)
		}
	}
	r := brokerctl(t, nil, "help", "half", "send")
	wantOK(t, r)
	for _, want := range []string{"usage: brokerctl half send TOPIC BODY|-", "-check-after", "-tx ID", "-addr addresses", "-context NAME"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help half send printed %q; want %q in it", r.stdout, want)
		}
	}
	r = brokerctl(t, nil, "help", "completion")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, "usage: brokerctl completion bash|zsh|fish") {
		t.Errorf("help completion printed %q", r.stdout)
	}
	r = brokerctl(t, nil, "help")
	wantOK(t, r)
	for _, want := range []string{"context add", "completion bash|zsh|fish", "--version"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help printed %q; want %q in it", r.stdout, want)
		}
	}
}

// Contexts against a real broker: a saved context supplies --addr and
// --timeout when selected by --context, TXMQ_CONTEXT or context use; the
// command line and TXMQ_ADDR win over it.
func TestContexts(t *testing.T) {
	b := realBroker(t)
	dead := deadAddress(t)
	env := map[string]string{"XDG_CONFIG_HOME": t.TempDir()}
	ctl := func(extra map[string]string, args ...string) result {
		t.Helper()
		e := map[string]string{}
		for k, v := range env {
			e[k] = v
		}
		for k, v := range extra {
			e[k] = v
		}
		return brokerctl(t, e, args...)
	}
	r := ctl(nil, "context", "add", "local", "--addr", b.Addr(), "--timeout", "5s")
	wantOK(t, r)
	path := filepath.Join(env["XDG_CONFIG_HOME"], "txmq", "context", "local.json")
	if !strings.Contains(r.stdout, path) {
		t.Fatalf("context add printed %q, want the path %s", r.stdout, path)
	}
	wantOK(t, ctl(nil, "context", "add", "nowhere", "--addr", dead, "--timeout", "300ms"))

	wantOK(t, ctl(nil, "--context", "local", "send", "orders", "one"))
	wantOK(t, ctl(map[string]string{"TXMQ_CONTEXT": "local"}, "send", "orders", "two"))
	r = ctl(map[string]string{"TXMQ_CONTEXT": "nowhere"}, "send", "orders", "three")
	if r.code != exitFailure || !strings.Contains(r.stderr, "Unavailable") || !strings.Contains(r.stderr, "300ms") {
		t.Fatalf("through context nowhere: exit %d, stderr %q; want Unavailable after its --timeout 300ms", r.code, r.stderr)
	}
	wantOK(t, ctl(map[string]string{"TXMQ_CONTEXT": "nowhere"}, "--addr", b.Addr(), "--timeout", "5s", "send", "orders", "flags win"))

	r = ctl(nil, "context", "use", "local")
	wantOK(t, r)
	wantOK(t, ctl(nil, "send", "orders", "four"))
	r = ctl(map[string]string{"TXMQ_ADDR": dead}, "--timeout", "300ms", "send", "orders", "five")
	if r.code != exitFailure {
		t.Fatalf("TXMQ_ADDR wins over the selected context: exit %d, stderr %q", r.code, r.stderr)
	}

	r = ctl(nil, "context", "ls", "-o", "json")
	wantOK(t, r)
	var listed []contextJSON
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var cj contextJSON
		if err := json.Unmarshal([]byte(line), &cj); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		listed = append(listed, cj)
	}
	want := []contextJSON{{Name: "local", Addr: b.Addr(), Timeout: "5s", Selected: true}, {Name: "nowhere", Addr: dead, Timeout: "300ms"}}
	if len(listed) != 2 || listed[0] != want[0] || listed[1] != want[1] {
		t.Fatalf("context ls: %+v, want %+v", listed, want)
	}
	r = ctl(nil, "context", "ls")
	wantOK(t, r)
	if !strings.Contains(r.stdout, "CONTEXT") || !strings.Contains(r.stdout, "local") || !strings.Contains(r.stdout, "*") {
		t.Fatalf("context ls printed:\n%s", r.stdout)
	}

	r = ctl(nil, "-o", "json", "consume", "orders", "--group", "g", "--count", "4")
	wantOK(t, r)
	for _, body := range []string{"one", "two", "flags win", "four"} {
		if !strings.Contains(r.stdout, `"body":"`+body+`"`) {
			t.Errorf("consume printed %q; want the body %q", r.stdout, body)
		}
	}

	wantOK(t, ctl(nil, "context", "rm", "local"))
	if _, err := os.Stat(filepath.Join(env["XDG_CONFIG_HOME"], "txmq", "context.txt")); !os.IsNotExist(err) {
		t.Fatalf("removing the selected context leaves a selection: %v", err)
	}
	for _, args := range [][]string{
		{"--context", "local", "send", "orders", "x"},
		{"context", "use", "local"},
		{"context", "rm", "local"},
		{"context", "add", "../escape", "--addr", b.Addr()},
		{"context", "add", "noaddr"},
	} {
		if r := ctl(nil, args...); r.code != exitUsage {
			t.Errorf("%q: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
	if r := brokerctl(t, nil, "context", "ls"); r.code != exitFailure || !strings.Contains(r.stderr, "HOME") {
		t.Errorf("without HOME: exit %d, stderr %q", r.code, r.stderr)
	}
}

// "-" as the body reads stdin, for send and half send, against a real
// broker.
func TestBodyFromStdin(t *testing.T) {
	b := realBroker(t)
	body := "line one\n\tline two\n"
	r := brokerctlStdin(t, body, nil, "--addr", b.Addr(), "-o", "json", "send", "orders", "-")
	wantOK(t, r)
	r = brokerctlStdin(t, body, nil, "--addr", b.Addr(), "half", "send", "orders", "-", "--group", "shop", "--tx", "t1")
	wantOK(t, r)
	halfID := strings.TrimSpace(r.stdout)
	r = brokerctl(t, nil, "--addr", b.Addr(), "-o", "json", "half", "show", halfID)
	wantOK(t, r)
	var half map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &half); err != nil || half["body"] != body {
		t.Fatalf("half show printed %q (%v); want the body %q", r.stdout, err, body)
	}
	r = brokerctl(t, nil, "--addr", b.Addr(), "-o", "json", "consume", "orders", "--group", "g", "--count", "1")
	wantOK(t, r)
	var d map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d["body"] != body {
		t.Fatalf("consume printed %q (%v); want the body %q", r.stdout, err, body)
	}
}

// --watch on group describe and half list prints frames until
// interrupted, which is a success, against a real broker.
func TestWatch(t *testing.T) {
	b := realBroker(t)
	wantOK(t, brokerctl(t, nil, "--addr", b.Addr(), "send", "orders", "x"))
	wantOK(t, brokerctl(t, nil, "--addr", b.Addr(), "consume", "orders", "--group", "points", "--count", "1"))
	wantOK(t, brokerctl(t, nil, "--addr", b.Addr(), "half", "send", "orders", "y", "--group", "shop", "--tx", "t1"))
	for _, tc := range []struct {
		args  []string
		frame string
	}{
		{[]string{"group", "describe", "points"}, "Consumer group:"},
		{[]string{"half", "list"}, "LAST-ERROR"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var stdout, stderr syncbuf.Buffer
		done := make(chan int, 1)
		args := append([]string{"--addr", b.Addr()}, append(tc.args, "--watch", "--interval", "5ms")...)
		go func() {
			done <- run(ctx, args, func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
		}()
		txmqtest.CheckFor(t, 10*time.Second, 5*time.Millisecond, func() error {
			if n := strings.Count(stdout.String(), tc.frame); n < 3 {
				return errFrames(n)
			}
			return nil
		})
		cancel()
		if code := <-done; code != exitOK || stderr.String() != "" {
			t.Fatalf("%q: exit %d, stderr %q", tc.args, code, stderr.String())
		}
		if !strings.Contains(stdout.String(), "\n\n") || strings.Contains(stdout.String(), clearScreen) {
			t.Fatalf("%q: frames on a pipe are separated by a blank line, without escape codes:\n%s", tc.args, stdout.String())
		}
	}
	r := brokerctl(t, nil, "--addr", b.Addr(), "group", "describe", "points", "--watch", "--interval", "0s")
	if r.code != exitUsage || !strings.Contains(r.stderr, "--interval must be positive") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

type errFrames int

func (n errFrames) Error() string { return fmt.Sprintf("%d frame(s) so far", int(n)) }

// The bash script completes command words and each command's flags, also
// after global flags with values; zsh and fish scripts parse where those
// shells exist.
func TestCompletion(t *testing.T) {
	scripts := map[string]string{}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		r := brokerctl(t, nil, "completion", shell)
		wantOK(t, r)
		scripts[shell] = r.stdout
	}
	for _, word := range []string{"send", "half", "rollback", "transfer-leader", "context", "--ordering-key", "--check-after", "--watch"} {
		for shell, script := range scripts {
			if shell == "fish" {
				// fish names a long flag with -l and no dashes.
				word = strings.TrimPrefix(word, "--")
			}
			if !strings.Contains(script, word) {
				t.Errorf("the %s script lacks %q", shell, word)
			}
		}
	}
	if r := brokerctl(t, nil, "completion", "tcsh"); r.code != exitUsage {
		t.Errorf("completion tcsh: exit %d", r.code)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Log("no bash: the bash script is not run")
	} else {
		for _, tc := range []struct {
			words string
			want  string
		}{
			{"brokerctl half s", "send show"},
			{"brokerctl --addr 127.0.0.1:7420 -o json half send orders b --gr", "--group"},
			{"brokerctl cl", "cluster"},
			{"brokerctl cluster transfer", "transfer-leader"},
		} {
			script := scripts["bash"] + "COMP_WORDS=(" + tc.words + "); COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _brokerctl; echo \"${COMPREPLY[*]}\"\n"
			out, err := exec.Command(bash, "--norc", "-c", script).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != tc.want {
				t.Errorf("completing %q: %q (%v), want %q", tc.words, out, err, tc.want)
			}
		}
	}
	for _, shell := range []string{"zsh", "fish"} {
		path, err := exec.LookPath(shell)
		if err != nil {
			t.Logf("no %s: its script is not checked", shell)
			continue
		}
		f := filepath.Join(t.TempDir(), "brokerctl."+shell)
		if err := os.WriteFile(f, []byte(scripts[shell]), 0o600); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(path, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n: %v: %s", shell, err, out)
		}
	}
}

// Enum values are read case-insensitively, with _ and - alike, so that
// what brokerctl prints (ROLLED_BACK, EARLIEST) is accepted back.
func TestEnumFlagsIgnoreCase(t *testing.T) {
	f := &fakeBroker{
		listHalf: func(*txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
			return &txmqv1.ListHalfMessagesResponse{}, nil
		},
		resetGroup: func(*txmqv1.ResetConsumerGroupRequest) (*txmqv1.ResetConsumerGroupResponse, error) {
			return &txmqv1.ResetConsumerGroupResponse{}, nil
		},
	}
	addr := f.start(t)
	for _, state := range []string{"rolled-back", "ROLLED_BACK", "Rolled_Back"} {
		wantOK(t, brokerctl(t, nil, "--addr", addr, "half", "list", "--state", state))
	}
	wantOK(t, brokerctl(t, nil, "--addr", addr, "group", "reset", "points", "--to", "EARLIEST", "--dry-run"))
	rolledBack := &txmqv1.ListHalfMessagesRequest{State: txmqv1.HalfState_HALF_STATE_ROLLED_BACK, Limit: listPageSize}
	wantRequests(t, f, rolledBack, rolledBack, rolledBack,
		&txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "points", To: txmqv1.StartPosition_START_POSITION_EARLIEST, DryRun: true})
}
