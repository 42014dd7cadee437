package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// startDeleteBroker starts a real single-node broker through the test
// harness, configured by configure when set, and returns its address.
func startDeleteBroker(t *testing.T, configure func(*broker.Config)) string {
	t.Helper()
	c := txmqtest.NewCluster(t, 1, func(s txmqtest.Spec) (*broker.Broker, error) {
		cfg := broker.Config{Raft: s.Raft, GRPCListener: s.API, Join: s.Join, Logger: txmqtest.Logger()}
		if configure != nil {
			configure(&cfg)
		}
		return broker.Open(cfg)
	})
	return c.Leader().Addr()
}

// terminalAnswers makes confirmations read answer from a terminal, or,
// with answer "", find no terminal.
func terminalAnswers(t *testing.T, answer string) {
	orig := terminalInput
	t.Cleanup(func() { terminalInput = orig })
	terminalInput = func() io.Reader {
		if answer == "" {
			return nil
		}
		return strings.NewReader(answer)
	}
}

// wantOut runs brokerctl against addr, expecting the exit code, and that
// stdout and stderr together hold each of want.
func wantOut(t *testing.T, addr string, code int, want []string, args ...string) result {
	t.Helper()
	r := brokerctl(t, nil, append([]string{"--addr", addr}, args...)...)
	if r.code != code {
		t.Fatalf("%q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, r.code, code, r.stdout, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stdout+r.stderr, w) {
			t.Fatalf("%q printed\nstdout:\n%s\nstderr:\n%s\nwant %q in it", args, r.stdout, r.stderr, w)
		}
	}
	return r
}

// topic delete shows what it drops, refuses while half messages may commit
// into the topic, asks on a terminal, refuses without one unless -f, and
// ends the topic's subscribers with NotFound.
func TestRealTopicDelete(t *testing.T) {
	addr := startDeleteBroker(t, nil)
	wantOut(t, addr, exitOK, nil, "send", "orders", "one")
	wantOut(t, addr, exitOK, nil, "send", "orders", "two")
	wantOut(t, addr, exitOK, nil, "consume", "orders", "--group", "points", "--count", "1")
	half := strings.TrimSpace(wantOut(t, addr, exitOK, nil, "half", "send", "orders", "later", "--group", "shop", "--tx", "t1").stdout)

	wantOut(t, addr, exitOK, []string{"Topic:", "orders", "2 (sequences 1 to 2)", "Pending half messages:", "1 (PENDING or EXPIRED",
		"GROUP", "points", "drops all of the above"}, "topic", "delete", "orders", "--dry-run")
	wantOut(t, addr, exitFailure, []string{"FailedPrecondition", `topic "orders" has 1 half message(s) PENDING or EXPIRED`}, "topic", "delete", "orders", "-f")
	wantOut(t, addr, exitFailure, []string{"FailedPrecondition", "nothing deleted"}, "topic", "delete", "orders")
	wantOut(t, addr, exitOK, nil, "half", "rollback", half)

	terminalAnswers(t, "")
	wantOut(t, addr, exitUsage, []string{"refusing to delete topic orders with its 2 message(s), 1 consumer group(s) and their 0 dead letter(s) without confirmation", "give -f"},
		"topic", "delete", "orders")
	terminalAnswers(t, "n\n")
	wantOut(t, addr, exitFailure, []string{"delete topic orders with its 2 message(s)", "[y/N]", "Aborted: not confirmed; nothing changed"}, "topic", "delete", "orders")
	wantOut(t, addr, exitOK, []string{"orders"}, "topic", "list")

	c, err := txmq.NewConsumer(txmq.ConsumerConfig{Addrs: []string{addr}, Topic: "orders", Group: "points", ClientID: "points-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ended := make(chan error, 1)
	go func() { ended <- c.Run(ctx, func(context.Context, *txmq.Delivery) error { return nil }) }()
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if r := brokerctl(t, nil, "--addr", addr, "group", "describe", "points", "--members"); !strings.Contains(r.stdout, "points-1") {
			return fmt.Errorf("no member points-1 in:\n%s%s", r.stdout, r.stderr)
		}
		return nil
	})

	terminalAnswers(t, "yes\n")
	wantOut(t, addr, exitOK, []string{"topic orders deleted: 2 message(s)", "1 consumer group(s)"}, "topic", "delete", "orders")
	if err := <-ended; err == nil || !strings.Contains(err.Error(), `topic "orders" was deleted`) {
		t.Fatalf("the consumer of the deleted topic ended with %v", err)
	}
	if r := wantOut(t, addr, exitOK, nil, "topic", "list"); strings.Contains(r.stdout, "orders") {
		t.Fatalf("topic list after the deletion:\n%s", r.stdout)
	}
	wantOut(t, addr, exitFailure, []string{"NotFound"}, "topic", "delete", "orders", "-f")
	wantOut(t, addr, exitFailure, []string{"NotFound"}, "topic", "delete", "orders", "--dry-run")

	wantOut(t, addr, exitOK, nil, "send", "audit", "x")
	r := wantOut(t, addr, exitOK, nil, "-o", "json", "topic", "delete", "audit", "-f")
	var got topicDeleteJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if got.Topic.Topic != "audit" || got.Topic.Messages != 1 || got.DryRun || len(got.Groups) != 0 {
		t.Fatalf("topic delete -o json printed %s", r.stdout)
	}
}

// group create, group list --unused, group describe --members and group
// delete, against a real broker.
func TestRealGroupCreateDeleteUnused(t *testing.T) {
	addr := startDeleteBroker(t, nil)
	wantOut(t, addr, exitOK, nil, "send", "orders", "one")
	wantOut(t, addr, exitOK, nil, "consume", "orders", "--group", "ponits", "--count", "1")
	wantOut(t, addr, exitOK, []string{"consumer group audit on topic orders created at position 1"}, "group", "create", "audit", "--topic", "orders", "--start", "latest")
	wantOut(t, addr, exitOK, []string{"consumer group audit on topic orders exists already, at position 1"}, "group", "create", "audit", "--topic", "orders")

	r := wantOut(t, addr, exitOK, []string{"ponits"}, "group", "list", "--unused")
	if strings.Contains(r.stdout, "audit") {
		t.Fatalf("an operator's group listed as unused:\n%s", r.stdout)
	}
	wantOut(t, addr, exitOK, []string{"TOPIC", "CLIENT-ID", "ADDRESS", "CONNECTED-SINCE"}, "group", "describe", "audit", "--members")

	wantOut(t, addr, exitOK, []string{"ponits", "orders", "true", "drops all of the above"}, "group", "delete", "ponits", "--dry-run")
	terminalAnswers(t, "")
	wantOut(t, addr, exitUsage, []string{"refusing to delete consumer group ponits on 1 topic(s)"}, "group", "delete", "ponits")
	wantOut(t, addr, exitOK, []string{"consumer group ponits deleted on 1 topic(s)"}, "group", "delete", "ponits", "-f")
	if r := wantOut(t, addr, exitOK, nil, "group", "list", "--unused"); strings.Contains(r.stdout, "ponits") {
		t.Fatalf("group list --unused after the deletion:\n%s", r.stdout)
	}
	wantOut(t, addr, exitFailure, []string{"NotFound"}, "group", "delete", "ponits", "-f")
	wantOut(t, addr, exitFailure, []string{"NotFound"}, "group", "delete", "audit", "--topic", "payments", "-f")
	wantOut(t, addr, exitFailure, []string{"NotFound"}, "group", "create", "audit", "--topic", "payments")
	wantOut(t, addr, exitUsage, []string{"--topic is required"}, "group", "create", "audit")
	wantOut(t, addr, exitFailure, []string{"InvalidArgument"}, "group", "delete", "bad name", "-f")

	wantOut(t, addr, exitOK, nil, "group", "config", "audit", "--max-deliveries", "3")
	wantOut(t, addr, exitOK, []string{"consumer group audit deleted on 1 topic(s) and its delivery policy"}, "group", "delete", "audit", "-f")
}

// With --auto-create-topics=false, consume refuses a misspelt topic or
// group with a hint instead of creating it.
func TestRealConsumeCreatesNothingWithoutAutoCreate(t *testing.T) {
	off := false
	addr := startDeleteBroker(t, func(cfg *broker.Config) { cfg.AutoCreateTopics = &off })
	wantOut(t, addr, exitFailure, []string{"NotFound", `topic "ordres" does not exist`, "brokerctl topic create ordres"},
		"consume", "ordres", "--group", "points", "--count", "1")
	wantOut(t, addr, exitOK, nil, "topic", "create", "orders")
	wantOut(t, addr, exitOK, nil, "send", "orders", "one")
	wantOut(t, addr, exitFailure, []string{"NotFound", "brokerctl group create points --topic orders"},
		"consume", "orders", "--group", "points", "--count", "1")
	if r := wantOut(t, addr, exitOK, nil, "topic", "list"); strings.Contains(r.stdout, "ordres") || strings.Contains(r.stdout, "points") {
		t.Fatalf("a typo created something:\n%s", r.stdout)
	}
	wantOut(t, addr, exitOK, nil, "group", "create", "points", "--topic", "orders")
	wantOut(t, addr, exitOK, []string{"one"}, "consume", "orders", "--group", "points", "--count", "1")
}

// dlq purge --dry-run lists what it would purge; purge, group reset and
// cluster remove ask first.
func TestRealDestructiveCommandsAsk(t *testing.T) {
	addr := startDeleteBroker(t, nil)
	wantOut(t, addr, exitOK, nil, "group", "config", "points", "--max-deliveries", "1")
	var ids []string
	for _, body := range []string{"one", "two"} {
		ids = append(ids, strings.TrimSpace(wantOut(t, addr, exitOK, nil, "send", "orders", body).stdout))
	}
	wantOut(t, addr, exitOK, nil, "consume", "orders", "--group", "points", "--count", "2", "--nack")
	txmqtest.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		if r := brokerctl(t, nil, "--addr", addr, "dlq", "list", "points"); !strings.Contains(r.stdout, ids[1]) {
			return fmt.Errorf("dlq list:\n%s%s", r.stdout, r.stderr)
		}
		return nil
	})

	wantOut(t, addr, exitOK, append([]string{"MSG-ID", "2 dead letter(s) of group points to purge"}, ids...), "dlq", "purge", "points", "--all", "--dry-run")
	terminalAnswers(t, "")
	wantOut(t, addr, exitUsage, []string{"refusing to purge 2 dead letter(s) of group points for good without confirmation"}, "dlq", "purge", "points", "--all")
	wantOut(t, addr, exitOK, ids, "dlq", "list", "points")
	wantOut(t, addr, exitUsage, []string{"OLD-POSITION", "refusing to reset consumer group points to earliest on 1 topic(s)"}, "group", "reset", "points", "--to", "earliest")
	wantOut(t, addr, exitUsage, []string{"refusing to remove node n9 from the cluster"}, "cluster", "remove", "n9")

	terminalAnswers(t, "y\n")
	wantOut(t, addr, exitOK, []string{ids[0], "1 dead letter(s) of group points to purge", "1 dead letter(s) of group points purged"}, "dlq", "purge", "points", ids[0])
	r := wantOut(t, addr, exitOK, nil, "-o", "json", "dlq", "purge", "points", "--all", "--dry-run")
	var plan purgeJSON
	if err := json.Unmarshal([]byte(r.stdout), &plan); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if !plan.DryRun || plan.Purged != 1 || len(plan.DeadLetters) != 1 || plan.DeadLetters[0].ID != ids[1] {
		t.Fatalf("dlq purge --dry-run -o json printed %s", r.stdout)
	}
	wantOut(t, addr, exitOK, []string{"Group points reset on 1 topic(s)"}, "group", "reset", "points", "--to", "earliest")
}
