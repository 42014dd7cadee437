package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// realCtl starts a one-node broker on 127.0.0.1 and returns a function
// that runs brokerctl against it, expecting success, and its address.
func realCtl(t *testing.T) (ctl func(args ...string) string, addr string) {
	t.Helper()
	b := realBroker(t)
	return func(args ...string) string {
		t.Helper()
		r := brokerctl(t, nil, append([]string{"--addr", b.Addr()}, args...)...)
		wantOK(t, r)
		return r.stdout
	}, b.Addr()
}

// wantFailure runs brokerctl against addr and expects exit code code with
// every one of want in its stderr.
func wantFailure(t *testing.T, addr string, code int, want []string, args ...string) result {
	t.Helper()
	r := brokerctl(t, nil, append([]string{"--addr", addr}, args...)...)
	if r.code != code {
		t.Fatalf("%q: exit %d, want %d; stderr %q", args, r.code, code, r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Fatalf("%q: stderr %q, want %q in it", args, r.stderr, w)
		}
	}
	return r
}

// jsonIDs are the "id" fields of a JSON listing, in order.
func jsonIDs(t *testing.T, out string) []string {
	t.Helper()
	var ids []string
	for line := range strings.Lines(out) {
		var obj struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &obj); err != nil {
			t.Fatalf("%v: %q", err, line)
		}
		ids = append(ids, obj.ID)
	}
	return ids
}

// half list filters, age order, paging with --limit and --after, the total;
// half show by --group/--tx; bad inputs.
func TestRealHalfListFiltersAndLookups(t *testing.T) {
	ctl, addr := realCtl(t)
	var ids []string
	for i, spec := range []struct{ topic, group string }{
		{"orders", "shop"}, {"orders", "shop"}, {"refunds", "shop"}, {"orders", "billing"},
	} {
		ids = append(ids, strings.TrimSpace(ctl("half", "send", spec.topic, fmt.Sprint("body-", i),
			"--group", spec.group, "--tx", fmt.Sprint("tx-", i))))
	}

	// Oldest first, each filter alone and together.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, ids},
		{[]string{"--topic", "orders"}, []string{ids[0], ids[1], ids[3]}},
		{[]string{"--group", "shop", "--topic", "orders"}, ids[:2]},
		{[]string{"--tx", "tx-2"}, ids[2:3]},
		{[]string{"--group", "billing", "--tx", "tx-3"}, ids[3:]},
		{[]string{"--group", "shop", "--tx", "tx-3"}, nil},
		{[]string{"--older-than", "1h"}, nil},
		{[]string{"--older-than", "0s", "--state", "all"}, ids},
		{[]string{"--state", "committed"}, nil},
	} {
		got := jsonIDs(t, ctl(append([]string{"-o", "json", "half", "list"}, tc.args...)...))
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("half list %q listed %v, want %v", tc.args, got, tc.want)
		}
	}

	// A page of two, its token, and the rest after it.
	out := ctl("half", "list", "--limit", "2")
	footer := fmt.Sprintf("2 of 4 matching shown; go on with --after %s\n", ids[1])
	if !strings.HasSuffix(out, footer) || !strings.Contains(out, ids[0]) || strings.Contains(out, ids[2]) {
		t.Fatalf("half list --limit 2 printed:\n%s\nwant ending %q", out, footer)
	}
	out = ctl("half", "list", "--after", ids[1])
	if !strings.HasSuffix(out, "\n4 matching\n") || !strings.Contains(out, ids[3]) || strings.Contains(out, ids[1]) {
		t.Fatalf("half list --after printed:\n%s", out)
	}

	out = ctl("half", "show", "--group", "shop", "--tx", "tx-2")
	if !strings.Contains(out, ids[2]) || !strings.Contains(out, "refunds") || !strings.Contains(out, "body-2") {
		t.Fatalf("half show --group --tx printed:\n%s", out)
	}

	for _, tc := range []struct {
		code int
		want []string
		args []string
	}{
		{exitUsage, []string{"--older-than must not be negative"}, []string{"half", "list", "--older-than", "-1s"}},
		{exitUsage, []string{"--state must be"}, []string{"half", "list", "--state", "stuck"}},
		{exitUsage, []string{"not both"}, []string{"half", "show", ids[0], "--group", "shop", "--tx", "tx-0"}},
		{exitUsage, []string{"--group G --tx TXID (both)"}, []string{"half", "show", "--group", "shop"}},
		{exitUsage, []string{"--group G --tx TXID (both)"}, []string{"half", "show"}},
		{exitFailure, []string{"NotFound", `transaction "tx-9"`}, []string{"half", "show", "--group", "shop", "--tx", "tx-9"}},
		{exitFailure, []string{"InvalidArgument", "topic"}, []string{"half", "list", "--topic", "no such/topic"}},
		{exitFailure, []string{"InvalidArgument", "producer_group"}, []string{"half", "show", "--group", "a b", "--tx", "t"}},
	} {
		wantFailure(t, addr, tc.code, tc.want, tc.args...)
	}
}

// half commit and rollback of several IDs, by --group/--tx, and of --all
// with filters: per-ID results, --dry-run, the confirmation of rollback
// --all.
func TestRealHalfBulkResolve(t *testing.T) {
	ctl, addr := realCtl(t)
	var ids []string
	for i := range 5 {
		ids = append(ids, strings.TrimSpace(ctl("half", "send", "orders", fmt.Sprint("body-", i),
			"--group", "shop", "--tx", fmt.Sprint("tx-", i))))
	}
	other := strings.TrimSpace(ctl("half", "send", "orders", "x", "--group", "billing", "--tx", "b-1"))

	// One of three is rolled back already: the two others are committed,
	// the conflict is printed with its ID, and the command fails.
	ctl("half", "rollback", "--group", "shop", "--tx", "tx-1")
	r := wantFailure(t, addr, exitFailure, []string{ids[1] + ": FailedPrecondition", "1 of 3 half message(s) not resolved"},
		"half", "commit", ids[0], ids[1], ids[2])
	if r.stdout != ids[0]+" COMMITTED\n"+ids[2]+" COMMITTED\n" {
		t.Fatalf("half commit of three printed %q", r.stdout)
	}

	// --dry-run of named messages shows them as they are, says how many
	// would change, and reports the unknown one.
	const unknown = "0000000000000000000000000000dead"
	r = wantFailure(t, addr, exitFailure, []string{"brokerctl: " + unknown + ": NotFound", "1 of 3 half message(s) not found"},
		"half", "rollback", ids[0], ids[3], unknown, "--dry-run")
	if !strings.Contains(r.stdout, ids[0]+"  orders  shop            tx-0  COMMITTED") || !strings.Contains(r.stdout, ids[3]+"  orders  shop            tx-3  PENDING") ||
		!strings.HasSuffix(r.stdout, "dry run: would roll back 1 of the 2 half message(s) listed (the others are resolved already); nothing changed\n") {
		t.Fatalf("rollback --dry-run of IDs printed:\n%s", r.stdout)
	}
	if out := ctl("half", "rollback", "--group", "shop", "--tx", "tx-4", "--dry-run"); !strings.HasSuffix(out, "dry run: would roll back 1 half message(s); nothing changed\n") {
		t.Fatalf("rollback --dry-run by transaction printed:\n%s", out)
	}

	// --dry-run lists what --all would roll back and changes nothing.
	out := ctl("half", "rollback", "--all", "--group", "shop", "--dry-run")
	if !strings.Contains(out, ids[3]) || !strings.Contains(out, ids[4]) || strings.Contains(out, other) ||
		!strings.HasSuffix(out, "dry run: would roll back 2 half message(s); nothing changed\n") {
		t.Fatalf("rollback --all --dry-run printed:\n%s", out)
	}
	pendingShop := func() []string {
		return jsonIDs(t, ctl("-o", "json", "half", "list", "--group", "shop"))
	}
	if got := pendingShop(); len(got) != 2 {
		t.Fatalf("after --dry-run, pending: %v", got)
	}

	// Without a terminal rollback --all refuses unless -f; on one, it
	// asks and takes only a yes.
	orig := terminalInput
	t.Cleanup(func() { terminalInput = orig })
	answer := ""
	terminalInput = func() io.Reader { return nil }
	wantFailure(t, addr, exitUsage, []string{"refusing to roll back 2 half message(s) without confirmation", "-f"},
		"half", "rollback", "--all", "--group", "shop")
	answer = "no\n"
	terminalInput = func() io.Reader { return strings.NewReader(answer) }
	wantFailure(t, addr, exitFailure, []string{"roll back 2 half message(s)? [y/N]", "Aborted: not confirmed; nothing changed"},
		"half", "rollback", "--all", "--group", "shop")
	if got := pendingShop(); len(got) != 2 {
		t.Fatalf("after answering no, pending: %v", got)
	}
	answer = "y\n"
	r = brokerctl(t, nil, "--addr", addr, "half", "rollback", "--all", "--group", "shop")
	if r.code != exitOK || r.stdout != ids[3]+" ROLLED_BACK\n"+ids[4]+" ROLLED_BACK\n" {
		t.Fatalf("rollback --all after yes: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	terminalInput = func() io.Reader { return nil }
	if out := ctl("half", "commit", "--all", "--group", "billing", "-f"); out != other+" COMMITTED\n" {
		t.Fatalf("commit --all printed %q", out)
	}
	if out := ctl("half", "rollback", "--all", "--state", "expired", "--force"); out != "0 matching; nothing to roll back\n" {
		t.Fatalf("rollback --all of nothing printed %q", out)
	}

	for _, tc := range []struct {
		want string
		args []string
	}{
		{"with --all, --state must be pending or expired", []string{"half", "commit", "--all", "--state", "committed"}},
		{"--state goes with --all", []string{"half", "commit", ids[0], "--state", "expired"}},
		{"give MSG_IDs or --all, not both", []string{"half", "rollback", ids[0], "--all", "-f"}},
		{"name the half message by MSG_ID", []string{"half", "commit"}},
		{"by MSG_ID or by --group and --tx, not both", []string{"half", "commit", ids[0], ids[1], "--group", "shop"}},
	} {
		wantFailure(t, addr, exitUsage, []string{tc.want}, tc.args...)
	}
	wantFailure(t, addr, exitFailure, []string{"InvalidArgument", "not a txmq message ID"}, "half", "commit", "nothex")
}

// checker answers every check-back with answer.
type checker struct {
	txmqv1.UnimplementedTransactionCheckerServer
	answer atomic.Int32
}

func (c *checker) CheckTransaction(context.Context, *txmqv1.CheckTransactionRequest) (*txmqv1.CheckTransactionResponse, error) {
	return &txmqv1.CheckTransactionResponse{Resolution: txmqv1.Resolution(c.answer.Load())}, nil
}

// startChecker serves c on 127.0.0.1 and returns its address.
func startChecker(t *testing.T, c *checker) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	txmqv1.RegisterTransactionCheckerServer(srv, c)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// half check on an EXPIRED message asks the producer again and applies its
// answer (docs/api.md promised it; the scheduler refused anything but
// PENDING).
func TestRealHalfCheckExpired(t *testing.T) {
	ctl, addr := realCtl(t)
	c := &checker{}
	c.answer.Store(int32(txmqv1.Resolution_RESOLUTION_UNKNOWN))
	ctl("group", "config", "shop", "--max-checks", "1", "--callback", "grpc://"+startChecker(t, c))
	id := strings.TrimSpace(ctl("half", "send", "orders", "paid", "--group", "shop", "--tx", "t1", "--check-after", "1s"))
	expired := func() error {
		if out := ctl("-o", "json", "half", "show", id); !strings.Contains(out, `"state":"EXPIRED"`) {
			return fmt.Errorf("not expired yet: %s", out)
		}
		return nil
	}
	txmqtest.CheckFor(t, 15*time.Second, 50*time.Millisecond, expired)

	// No answer: it stays EXPIRED, and the check says so.
	out := ctl("half", "check", id)
	if !strings.Contains(out, "Answer:          UNKNOWN") || !strings.Contains(out, "State:           EXPIRED") {
		t.Fatalf("half check answered UNKNOWN printed:\n%s", out)
	}
	c.answer.Store(int32(txmqv1.Resolution_RESOLUTION_COMMIT))
	out = ctl("half", "check", id)
	if !strings.Contains(out, "Answer:          COMMIT") || !strings.Contains(out, "State:           COMMITTED") {
		t.Fatalf("half check answered COMMIT printed:\n%s", out)
	}
	if out := ctl("half", "show", id); !strings.Contains(out, "Resolved by:       OPERATOR") {
		t.Fatalf("half show after the check:\n%s", out)
	}
	if out := ctl("msg", "get", "--id", id); !strings.Contains(out, "paid") || !strings.Contains(out, "Transaction ID:  t1") {
		t.Fatalf("msg get of the committed message:\n%s", out)
	}
	wantFailure(t, addr, exitFailure, []string{"FailedPrecondition", "only pending and expired messages are checked"}, "half", "check", id)
}

// msg get, msg find and consume --peek read committed messages without a
// consumer group: none is created, nothing is acked.
func TestRealMsgGetFindPeek(t *testing.T) {
	ctl, addr := realCtl(t)
	first := strings.TrimSpace(ctl("send", "orders", "order-1 paid", "--key", "order-1", "--prop", "source=cli"))
	second := strings.TrimSpace(ctl("send", "orders", "order-2 paid", "--ordering-key", "customer-7"))
	refund := strings.TrimSpace(ctl("send", "refunds", "order-1 refunded", "--key", "order-1"))
	pending := strings.TrimSpace(ctl("half", "send", "orders", "later", "--group", "shop", "--tx", "t1"))

	out := ctl("msg", "get", "orders", "2")
	for _, want := range []string{second, "Sequence:        2", "Ordering key:    customer-7", "order-2 paid"} {
		if !strings.Contains(out, want) {
			t.Fatalf("msg get orders 2 printed:\n%s\nwant %q", out, want)
		}
	}
	out = ctl("-o", "json", "msg", "get", "--id", first)
	var got topicMessageJSON
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != first || got.Topic != "orders" || got.Sequence != 1 || got.Key != "order-1" ||
		got.Properties["source"] != "cli" || got.Body == nil || *got.Body != "order-1 paid" || got.CommittedAt == "" {
		t.Fatalf("msg get --id printed %s", out)
	}
	if out := ctl("msg", "get", "--id", refund, "refunds"); !strings.Contains(out, "order-1 refunded") {
		t.Fatalf("msg get --id in its topic printed:\n%s", out)
	}

	if ids := jsonIDs(t, ctl("-o", "json", "msg", "find", "--key", "order-1")); strings.Join(ids, ",") != first+","+refund {
		t.Fatalf("msg find --key order-1 found %v", ids)
	}
	out = ctl("msg", "find", "--key", "order-1", "--topic", "refunds")
	if !strings.Contains(out, refund) || strings.Contains(out, first) {
		t.Fatalf("msg find --topic refunds printed:\n%s", out)
	}

	out = ctl("consume", "orders", "--peek", "--count", "2")
	if want := first + "  seq=1  key=order-1  order-1 paid\n" + second + "  seq=2  key=  ordering-key=customer-7  order-2 paid\n"; out != want {
		t.Fatalf("consume --peek printed:\n%s\nwant:\n%s", out, want)
	}
	if out := ctl("consume", "orders", "--peek", "--start", "latest", "--wait", "100ms"); out != "" {
		t.Fatalf("consume --peek --start latest printed %q", out)
	}
	// Nothing was created or acked: a group created now starts with both.
	if out := ctl("-o", "json", "topic", "list"); strings.Contains(out, `"consumer_groups":["`) {
		t.Fatalf("a consumer group appeared: %s", out)
	}
	if out := ctl("consume", "orders", "--group", "points", "--count", "2"); !strings.Contains(out, first) || !strings.Contains(out, second) {
		t.Fatalf("consume of a new group printed:\n%s", out)
	}

	for _, tc := range []struct {
		code int
		want []string
		args []string
	}{
		{exitUsage, []string{"SEQ must be a sequence number"}, []string{"msg", "get", "orders", "0"}},
		{exitUsage, []string{"name the message by TOPIC SEQ"}, []string{"msg", "get", "orders"}},
		{exitUsage, []string{"not both"}, []string{"msg", "get", "orders", "1", "--id", first}},
		{exitUsage, []string{"--key is required"}, []string{"msg", "find"}},
		{exitUsage, []string{"--peek reads without a consumer group"}, []string{"consume", "orders", "--peek", "--group", "g"}},
		{exitUsage, []string{"--peek reads without a consumer group"}, []string{"consume", "orders", "--peek", "--nack-delay", "1s"}},
		{exitFailure, []string{"NotFound", "retains sequences 1 to 2"}, []string{"msg", "get", "orders", "9"}},
		{exitFailure, []string{"NotFound", `topic "nosuch"`}, []string{"msg", "get", "nosuch", "1"}},
		{exitFailure, []string{"InvalidArgument", "not a txmq message ID"}, []string{"msg", "get", "--id", "nothex"}},
		{exitFailure, []string{"NotFound", "PENDING", "half show"}, []string{"msg", "get", "--id", pending}},
		{exitFailure, []string{"NotFound", "in topic refunds"}, []string{"msg", "get", "--id", first, "refunds"}},
		{exitFailure, []string{"NotFound", `topic "nosuch"`}, []string{"msg", "find", "--key", "k", "--topic", "nosuch"}},
		{exitFailure, []string{"NotFound", `topic "nosuch"`}, []string{"consume", "nosuch", "--peek"}},
	} {
		wantFailure(t, addr, tc.code, tc.want, tc.args...)
	}
}
