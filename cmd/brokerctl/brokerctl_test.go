package main

import (
	"context"
	"encoding/json"
	"flag"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

var (
	created   = timestamppb.New(time.Date(2026, 5, 1, 10, 0, 0, 500_000_000, time.UTC))
	nextCheck = timestamppb.New(time.Date(2026, 5, 1, 10, 0, 6, 0, time.UTC))
)

func pending(id string) *txmqv1.HalfMessage {
	return &txmqv1.HalfMessage{
		MessageId:     id,
		Topic:         "orders",
		ProducerGroup: "shop",
		TransactionId: "tx-" + id,
		Body:          []byte("order paid"),
		BodySize:      10,
		State:         txmqv1.HalfState_HALF_STATE_PENDING,
		CreatedAt:     created,
		CheckAttempts: 2,
		NextCheckAt:   nextCheck,
	}
}

func TestReorder(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.String("group", "", "")
	fs.Bool("verbose", false, "")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"orders", "body", "--group", "G"}, []string{"--group", "G", "--", "orders", "body"}},
		{[]string{"--group=G", "orders"}, []string{"--group=G", "--", "orders"}},
		{[]string{"orders", "--verbose", "body"}, []string{"--verbose", "--", "orders", "body"}},
		{[]string{"orders", "--", "--group", "-5"}, []string{"--", "orders", "--group", "-5"}},
		{[]string{"-", "--unknown", "x"}, []string{"--unknown", "--", "-", "x"}},
		{[]string{"orders", "--group"}, []string{"--group"}},
		{[]string{"orders", "--verbose", "--group"}, []string{"--verbose", "--group"}},
	} {
		if got := reorder(fs, tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("reorder(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}

func TestHalfSendFlagsAfterPositionals(t *testing.T) {
	f := &fakeBroker{sendHalf: func(*txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
		return &txmqv1.SendHalfResponse{MessageId: "m1", State: txmqv1.HalfState_HALF_STATE_PENDING}, nil
	}}
	addr := f.start(t)
	r := brokerctl(t, nil, "--addr", addr, "half", "send", "orders", `{"id":1}`,
		"--group", "G", "--tx", "T", "--key", "K", "--check-after", "2s", "--prop", "a=1", "--prop", "b=x=y")
	wantOK(t, r)
	if r.stdout != "m1\n" {
		t.Errorf("stdout %q, want the message ID", r.stdout)
	}
	wantRequests(t, f, &txmqv1.SendHalfRequest{
		Topic:         "orders",
		ProducerGroup: "G",
		TransactionId: "T",
		Key:           "K",
		Properties:    map[string]string{"a": "1", "b": "x=y"},
		Body:          []byte(`{"id":1}`),
		CheckAfter:    durationpb.New(2 * time.Second),
	})
}

func TestHalfSendJSON(t *testing.T) {
	f := &fakeBroker{sendHalf: func(*txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
		return &txmqv1.SendHalfResponse{MessageId: "m1", Duplicate: true, State: txmqv1.HalfState_HALF_STATE_COMMITTED}, nil
	}}
	addr := f.start(t)
	r := brokerctl(t, nil, "-o", "json", "half", "send", "orders", "b", "--group", "G", "--tx", "T", "--addr", addr)
	wantOK(t, r)
	if want := `{"id":"m1","duplicate":true,"state":"COMMITTED"}` + "\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	wantRequests(t, f, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "G", TransactionId: "T", Body: []byte("b")})
}

func TestAddressFromEnvironment(t *testing.T) {
	f := &fakeBroker{send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return &txmqv1.SendResponse{MessageId: "m1"}, nil
	}}
	addr := f.start(t)

	wantOK(t, brokerctl(t, map[string]string{"TXMQ_ADDR": addr}, "send", "orders", "one"))
	// --addr wins over the environment, which points nowhere here.
	wantOK(t, brokerctl(t, map[string]string{"TXMQ_ADDR": "127.0.0.1:1"}, "send", "orders", "two", "--addr", addr))
	wantRequests(t, f,
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("one")},
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("two")})
}

func TestGlobalFlagsBeforeOrAfterCommand(t *testing.T) {
	f := &fakeBroker{listHalf: func(*txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
		return &txmqv1.ListHalfMessagesResponse{Messages: []*txmqv1.HalfMessage{pending("m1"), pending("m2")}}, nil
	}}
	addr := f.start(t)
	for _, args := range [][]string{
		{"--addr", addr, "-o", "json", "half", "list"},
		{"half", "list", "--addr", addr, "-o", "json"},
		{"-o=json", "half", "list", "-addr=" + addr, "--timeout", "5s"},
	} {
		r := brokerctl(t, nil, args...)
		wantOK(t, r)
		lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
		if len(lines) != 2 {
			t.Fatalf("%q printed %q, want one JSON object per line for 2 messages", args, r.stdout)
		}
		for _, line := range lines {
			var obj map[string]any
			if err := json.Unmarshal([]byte(line), &obj); err != nil {
				t.Errorf("%q printed %q: %v", args, line, err)
			}
		}
	}
}

func TestSend(t *testing.T) {
	f := &fakeBroker{send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return &txmqv1.SendResponse{MessageId: "m7", Sequence: 7, Duplicate: true}, nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "send", "orders", "hello", "--key", "k1", "--prop", "a=1")
	// A duplicate is said on stderr; stdout has the (first) ID alone.
	note := "brokerctl: duplicate of message m7: key \"k1\" was sent to orders within the dedup window; nothing new was stored\n"
	if r.code != exitOK || r.stderr != note {
		t.Errorf("exit code %d, stderr %q; want 0 and %q", r.code, r.stderr, note)
	}
	if r.stdout != "m7\n" {
		t.Errorf("table stdout %q, want the message ID", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "-o", "json", "send", "--", "orders", "-not-a-flag")
	wantOK(t, r)
	if want := `{"id":"m7","sequence":7,"duplicate":true}` + "\n"; r.stdout != want {
		t.Errorf("json stdout %q, want %q", r.stdout, want)
	}
	wantRequests(t, f,
		&txmqv1.SendRequest{Topic: "orders", Key: "k1", Properties: map[string]string{"a": "1"}, Body: []byte("hello")},
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("-not-a-flag")})
}

func TestHalfListPages(t *testing.T) {
	longError := "rpc error: code = Unavailable desc = connection error:\n\tdial tcp 10.0.0.7:9000: connect: connection refused"
	f := &fakeBroker{listHalf: func(req *txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
		if req.GetPageToken() == "" {
			failing := pending("m2")
			failing.LastCheckError = longError
			return &txmqv1.ListHalfMessagesResponse{Messages: []*txmqv1.HalfMessage{pending("m1"), failing}, NextPageToken: "m2"}, nil
		}
		resolved := pending("m3")
		resolved.State = txmqv1.HalfState_HALF_STATE_EXPIRED
		resolved.NextCheckAt = nil
		resolved.LastCheckError = "no answer: UNKNOWN"
		return &txmqv1.ListHalfMessagesResponse{Messages: []*txmqv1.HalfMessage{resolved}}, nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "half", "list")
	wantOK(t, r)
	want := `MSG-ID  TOPIC   PRODUCER-GROUP  TX     STATE    CREATED               ATTEMPTS  NEXT-CHECK            LAST-ERROR
m1      orders  shop            tx-m1  PENDING  2026-05-01T10:00:00Z  2         2026-05-01T10:00:06Z  -
m2      orders  shop            tx-m2  PENDING  2026-05-01T10:00:00Z  2         2026-05-01T10:00:06Z  rpc error: code = Unavailable desc =...
m3      orders  shop            tx-m3  EXPIRED  2026-05-01T10:00:00Z  2         -                     no answer: UNKNOWN
3 matching
`
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}

	// JSON has the whole error.
	r = brokerctl(t, nil, "--addr", addr, "half", "list", "-o", "json")
	wantOK(t, r)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("json printed %q, want 3 lines", r.stdout)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &obj); err != nil || obj["last_check_error"] != longError {
		t.Errorf("json line %q (%v): want last_check_error %q", lines[1], err, longError)
	}
	if strings.Contains(lines[0], "last_check_error") {
		t.Errorf("json line %q has a last_check_error, want none", lines[0])
	}
	pendingState := txmqv1.HalfState_HALF_STATE_PENDING
	page1 := &txmqv1.ListHalfMessagesRequest{State: pendingState, Limit: 100}
	page2 := &txmqv1.ListHalfMessagesRequest{State: pendingState, Limit: 100, PageToken: "m2"}
	wantRequests(t, f, page1, page2, page1, page2)
}

func TestTableCell(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"", "-"},
		{"  \n ", "-"},
		{"short", "short"},
		{"two\nlines\tand  tabs", "two lines and tabs"},
		{strings.Repeat("x", 40), strings.Repeat("x", 40)},
		{strings.Repeat("x", 41), strings.Repeat("x", 37) + "..."},
		{strings.Repeat("é", 50), strings.Repeat("é", 37) + "..."},
	} {
		if got := tableCell(tc.in, 40); got != tc.want {
			t.Errorf("tableCell(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestHalfListFilters(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		lines int
		want  []proto.Message
	}{
		{
			args:  []string{"--state", "all"},
			lines: 4,
			want: []proto.Message{
				&txmqv1.ListHalfMessagesRequest{Limit: 100},
				&txmqv1.ListHalfMessagesRequest{Limit: 100, PageToken: "m2"},
			},
		},
		{
			args:  []string{"--group", "shop", "--state", "expired", "--limit", "2"},
			lines: 2,
			want: []proto.Message{
				&txmqv1.ListHalfMessagesRequest{ProducerGroup: "shop", State: txmqv1.HalfState_HALF_STATE_EXPIRED, Limit: 2},
			},
		},
		{
			args:  []string{"--state", "rolled-back", "--limit", "3"},
			lines: 3,
			want: []proto.Message{
				&txmqv1.ListHalfMessagesRequest{State: txmqv1.HalfState_HALF_STATE_ROLLED_BACK, Limit: 3},
				&txmqv1.ListHalfMessagesRequest{State: txmqv1.HalfState_HALF_STATE_ROLLED_BACK, Limit: 1, PageToken: "m2"},
			},
		},
		{
			args:  []string{"--state", "committed"},
			lines: 4,
			want: []proto.Message{
				&txmqv1.ListHalfMessagesRequest{State: txmqv1.HalfState_HALF_STATE_COMMITTED, Limit: 100},
				&txmqv1.ListHalfMessagesRequest{State: txmqv1.HalfState_HALF_STATE_COMMITTED, Limit: 100, PageToken: "m2"},
			},
		},
	} {
		f := &fakeBroker{listHalf: func(req *txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
			if req.GetPageToken() == "" {
				return &txmqv1.ListHalfMessagesResponse{Messages: []*txmqv1.HalfMessage{pending("m1"), pending("m2")}, NextPageToken: "m2"}, nil
			}
			return &txmqv1.ListHalfMessagesResponse{Messages: []*txmqv1.HalfMessage{pending("m3"), pending("m4")}}, nil
		}}
		addr := f.start(t)
		r := brokerctl(t, nil, append([]string{"--addr", addr, "-o", "json", "half", "list"}, tc.args...)...)
		wantOK(t, r)
		if got := strings.Count(r.stdout, "\n"); got != tc.lines {
			t.Errorf("%q printed %d lines, want %d:\n%s", tc.args, got, tc.lines, r.stdout)
		}
		wantRequests(t, f, tc.want...)
	}
}

func TestHalfListRepeatedPageToken(t *testing.T) {
	f := &fakeBroker{listHalf: func(*txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
		return &txmqv1.ListHalfMessagesResponse{Messages: []*txmqv1.HalfMessage{pending("m1")}, NextPageToken: "m1"}, nil
	}}
	addr := f.start(t)
	r := brokerctl(t, nil, "--addr", addr, "-o", "json", "half", "list")
	if r.code != exitFailure || r.stderr != "brokerctl: Internal: the broker returned page token \"m1\" twice\n" {
		t.Errorf("exit code %d, stderr %q", r.code, r.stderr)
	}
	if got := strings.Count(r.stdout, "\n"); got != 2 {
		t.Errorf("printed %d messages before failing, want 2", got)
	}
}

func TestHalfShow(t *testing.T) {
	msg := pending("m1")
	msg.Key = "order-42"
	msg.Properties = map[string]string{"region": "eu", "channel": "web"}
	msg.Body = []byte("order 42\tpaid")
	msg.LastCheckError = "producer unreachable"
	binary := pending("m2")
	binary.Body = []byte{0xff, 0x00, 0x01}
	binary.BodySize = 3
	committed := pending("m3")
	committed.Body = nil
	committed.State = txmqv1.HalfState_HALF_STATE_COMMITTED
	committed.ResolvedAt = nextCheck
	committed.ResolutionSource = txmqv1.ResolutionSource_RESOLUTION_SOURCE_OPERATOR
	committed.Sequence = 12
	committed.NextCheckAt = nil
	messages := map[string]*txmqv1.HalfMessage{"m1": msg, "m2": binary, "m3": committed}
	f := &fakeBroker{getHalf: func(req *txmqv1.GetHalfMessageRequest) (*txmqv1.GetHalfMessageResponse, error) {
		return &txmqv1.GetHalfMessageResponse{Message: messages[req.GetMessageId()]}, nil
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"half", "show", "m1"}, `Message ID:        m1
Topic:             orders
Producer group:    shop
Transaction ID:    tx-m1
Key:               order-42
State:             PENDING
Created:           2026-05-01T10:00:00Z
Resolved:          -
Resolved by:       -
Sequence:          0
Check attempts:    2
Next check:        2026-05-01T10:00:06Z
Last check error:  producer unreachable
Properties:        channel=web
                   region=eu
Body size:         10
Body:
order 42	paid
`},
		{[]string{"half", "show", "m2"}, `Message ID:        m2
Topic:             orders
Producer group:    shop
Transaction ID:    tx-m2
Key:               -
State:             PENDING
Created:           2026-05-01T10:00:00Z
Resolved:          -
Resolved by:       -
Sequence:          0
Check attempts:    2
Next check:        2026-05-01T10:00:06Z
Last check error:  -
Properties:        -
Body size:         3
Body (base64):
/wAB
`},
		{[]string{"half", "show", "m3", "-o", "json"}, `{"id":"m3","topic":"orders","producer_group":"shop","transaction_id":"tx-m3","key":"","properties":{},"body_size":10,"state":"COMMITTED","created_at":"2026-05-01T10:00:00.5Z","resolved_at":"2026-05-01T10:00:06Z","resolution_source":"OPERATOR","sequence":12,"check_attempts":2}` + "\n"},
		{[]string{"half", "show", "m2", "-o", "json"}, `{"id":"m2","topic":"orders","producer_group":"shop","transaction_id":"tx-m2","key":"","properties":{},"body_base64":"/wAB","body_size":3,"state":"PENDING","created_at":"2026-05-01T10:00:00.5Z","sequence":0,"check_attempts":2,"next_check_at":"2026-05-01T10:00:06Z"}` + "\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.GetHalfMessageRequest{MessageId: "m1"},
		&txmqv1.GetHalfMessageRequest{MessageId: "m2"},
		&txmqv1.GetHalfMessageRequest{MessageId: "m3"},
		&txmqv1.GetHalfMessageRequest{MessageId: "m2"})
}

func TestHalfCommitAndRollback(t *testing.T) {
	f := &fakeBroker{resolveHalf: func(req *txmqv1.ResolveHalfMessageRequest) (*txmqv1.ResolveHalfMessageResponse, error) {
		m := pending(req.GetMessageId())
		m.State = txmqv1.HalfState_HALF_STATE_ROLLED_BACK
		if req.GetResolution() == txmqv1.Resolution_RESOLUTION_COMMIT {
			m.State = txmqv1.HalfState_HALF_STATE_COMMITTED
		}
		return &txmqv1.ResolveHalfMessageResponse{Message: m}, nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "half", "commit", "m1")
	wantOK(t, r)
	if r.stdout != "m1 COMMITTED\n" {
		t.Errorf("commit printed %q", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "half", "rollback", "m2")
	wantOK(t, r)
	if r.stdout != "m2 ROLLED_BACK\n" {
		t.Errorf("rollback printed %q", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "-o", "json", "half", "commit", "m3")
	wantOK(t, r)
	var obj map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &obj); err != nil || obj["id"] != "m3" || obj["state"] != "COMMITTED" {
		t.Errorf("json commit printed %q (%v)", r.stdout, err)
	}
	wantRequests(t, f,
		&txmqv1.ResolveHalfMessageRequest{MessageId: "m1", Resolution: txmqv1.Resolution_RESOLUTION_COMMIT},
		&txmqv1.ResolveHalfMessageRequest{MessageId: "m2", Resolution: txmqv1.Resolution_RESOLUTION_ROLLBACK},
		&txmqv1.ResolveHalfMessageRequest{MessageId: "m3", Resolution: txmqv1.Resolution_RESOLUTION_COMMIT})
}

func TestBrokerErrors(t *testing.T) {
	f := &fakeBroker{
		resolveHalf: func(*txmqv1.ResolveHalfMessageRequest) (*txmqv1.ResolveHalfMessageResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "half message m1 is ROLLED_BACK, cannot commit")
		},
		getHalf: func(*txmqv1.GetHalfMessageRequest) (*txmqv1.GetHalfMessageResponse, error) {
			return nil, status.Error(codes.NotFound, "half message nope not found")
		},
		send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			// A follower that knows no leader: there is none to retry on.
			return nil, notLeaderError("not the leader, and there is no leader", "")
		},
	}
	addr := f.start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"half", "commit", "m1"}, "brokerctl: FailedPrecondition: half message m1 is ROLLED_BACK, cannot commit\n"},
		{[]string{"half", "show", "nope", "-o", "json"}, "brokerctl: NotFound: half message nope not found\n"},
		{[]string{"send", "orders", "b"}, "brokerctl: Unavailable: not the leader, and there is no leader (gave up after retrying for --timeout 300ms)\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr, "--timeout", "300ms"}, tc.args...)...)
		if r.code != exitFailure || r.stderr != tc.want || r.stdout != "" {
			t.Errorf("%q: exit code %d, stdout %q, stderr %q; want 1, nothing, %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	f := &fakeBroker{}
	addr := f.start(t)
	for _, args := range [][]string{
		{},
		{"bogus"},
		{"half"},
		{"half", "bogus"},
		{"--bogus", "topic", "list"},
		{"topic", "list", "--bogus"},
		{"topic", "list", "extra"},
		{"-o", "yaml", "topic", "list"},
		{"topic", "list", "--timeout", "0s"},
		{"send", "orders"},
		{"send", "orders", "b", "extra"},
		{"send", "orders", "b", "--prop", "novalue"},
		{"half", "send", "orders", "b", "--tx", "T"},
		{"half", "send", "orders", "b", "--group", "G"},
		{"half", "send", "orders", "b", "--group", "G", "--tx", "T", "--check-after", "soon"},
		{"half", "list", "--state", "open"},
		{"half", "list", "--limit", "-1"},
		{"half", "show"},
		{"consume", "orders"},
		{"consume", "orders", "--group", "g", "--from", "middle"},
		{"consume", "orders", "--group", "g", "--wait", "0s"},
		{"group", "describe"},
		{"--addr", "", "topic", "list"},
		{"--addr", "127.0.0.1:7420,,127.0.0.1:7430", "topic", "list"},
		{"cluster"},
		{"cluster", "bogus"},
		{"cluster", "status", "extra"},
		{"cluster", "join"},
		{"cluster", "join", "n3"},
		{"cluster", "join", "n3", "127.0.0.1:7441", "extra"},
		{"cluster", "join", "n3", "nohost"},
		{"cluster", "join", "n3", "127.0.0.1:"},
		{"cluster", "join", "", "127.0.0.1:7441"},
		{"cluster", "join", "n3", "127.0.0.1:7441", "--grpc", "7440"},
		{"cluster", "join", "n3", "127.0.0.1:7441", "--grpc", ""},
		{"cluster", "remove"},
		{"cluster", "remove", "n2", "n3"},
		{"cluster", "remove", ""},
		{"cluster", "transfer-leader", "n2", "n3"},
		{"cluster", "transfer-leader", ""},
		{"cluster", "snapshot", "n1"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, "usage: brokerctl") || r.stdout != "" {
			t.Errorf("%q: exit code %d, stdout %q, stderr %q; want 2 and the usage on stderr", args, r.code, r.stdout, r.stderr)
		}
	}
	if got := f.recorded(); len(got) != 0 {
		t.Errorf("usage errors reached the broker: %v", got)
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"half", "send", "-h"}, {"consume", "--help"}} {
		r := brokerctl(t, nil, args...)
		if r.code != exitOK || !strings.Contains(r.stdout+r.stderr, "usage: brokerctl") {
			t.Errorf("%q: exit code %d, stdout %q, stderr %q; want 0 and the usage", args, r.code, r.stdout, r.stderr)
		}
	}
}

func delivery(id string, attempt uint32, key, body string) *txmqv1.Delivery {
	return &txmqv1.Delivery{
		MessageId:   id,
		Topic:       "orders",
		Key:         key,
		Body:        []byte(body),
		Attempt:     attempt,
		CommittedAt: created,
		Sequence:    uint64(attempt) + 10,
	}
}

func ack(id string) *txmqv1.SubscribeRequest {
	return &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: []string{id}}}}
}

func subscription(topic, group string, from txmqv1.StartPosition, window uint32) *txmqv1.SubscribeRequest {
	return &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
		Topic:         topic,
		ConsumerGroup: group,
		StartPosition: from,
		MaxInFlight:   window,
	}}}
}

func TestConsumeCount(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(true,
		delivery("m1", 1, "k1", "hello"),
		delivery("m2", 2, "", "line1\nline2"),
		delivery("m3", 1, "", "not printed"))
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--count", "2")
	wantOK(t, r)
	want := "m1  attempt=1  key=k1  hello\n" + `m2  attempt=2  key=  "line1\nline2"` + "\n"
	if r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	wantRequests(t, f, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 2), ack("m1"), ack("m2"))
}

func TestConsumeWait(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(true, delivery("m1", 1, "", "hello"))
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--wait", "200ms", "--from", "latest")
	wantOK(t, r)
	if r.stdout != "m1  attempt=1  key=  hello\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	wantRequests(t, f, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_LATEST, 64), ack("m1"))
}

func TestConsumeNothing(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(true)
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--wait", "50ms", "--count", "1")
	wantOK(t, r)
	if r.stdout != "" {
		t.Errorf("stdout %q, want nothing", r.stdout)
	}
	wantRequests(t, f, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 1))
}

func TestConsumeJSON(t *testing.T) {
	text := delivery("m1", 1, "k1", "hello")
	text.Properties = map[string]string{"region": "eu"}
	text.ProducerGroup = "shop"
	text.TransactionId = "order-42:paid"
	binary := delivery("m2", 3, "", "")
	binary.Body = []byte{0xff, 0xfe}
	f := &fakeBroker{}
	f.serveDeliveries(true, text, binary)
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "-o", "json", "consume", "orders", "--group", "points", "--count", "2")
	wantOK(t, r)
	want := `{"id":"m1","topic":"orders","key":"k1","properties":{"region":"eu"},"body":"hello","attempt":1,"sequence":11,"committed_at":"2026-05-01T10:00:00.5Z","producer_group":"shop","transaction_id":"order-42:paid"}
{"id":"m2","topic":"orders","key":"","properties":{},"body_base64":"//4=","attempt":3,"sequence":13,"committed_at":"2026-05-01T10:00:00.5Z"}
`
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
}

func TestConsumeAckNotConfirmed(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(false, delivery("m1", 1, "", "hello"))
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--count", "1", "--timeout", "100ms")
	want := "brokerctl: DeadlineExceeded: the broker did not confirm 1 ack(s) within 100ms; those messages may be delivered again\n"
	if r.code != exitFailure || r.stderr != want {
		t.Errorf("exit code %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
	if r.stdout != "m1  attempt=1  key=  hello\n" {
		t.Errorf("stdout %q", r.stdout)
	}
}

func TestConsumeRefused(t *testing.T) {
	f := &fakeBroker{subscribe: func(stream txmqv1.ConsumerService_SubscribeServer) error {
		if _, err := stream.Recv(); err != nil {
			return err
		}
		return status.Error(codes.NotFound, "topic nope not found")
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "consume", "nope", "--group", "points")
	if r.code != exitFailure || r.stderr != "brokerctl: NotFound: topic nope not found\n" {
		t.Errorf("exit code %d, stderr %q", r.code, r.stderr)
	}
}

func TestConsumeNotAccepted(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(txmqv1.ConsumerService_SubscribeServer) error
		stderr string
	}{
		{
			name: "silent",
			answer: func(stream txmqv1.ConsumerService_SubscribeServer) error {
				<-stream.Context().Done()
				return nil
			},
			stderr: "brokerctl: DeadlineExceeded: the broker did not accept the subscription within 100ms\n",
		},
		{
			name:   "closed",
			answer: func(txmqv1.ConsumerService_SubscribeServer) error { return nil },
			// Unavailable: tried again until --timeout.
			stderr: "brokerctl: Unavailable: the broker ended the stream without accepting the subscription (gave up after retrying for --timeout 100ms)\n",
		},
	} {
		f := &fakeBroker{subscribe: func(stream txmqv1.ConsumerService_SubscribeServer) error {
			if _, err := stream.Recv(); err != nil {
				return err
			}
			return tc.answer(stream)
		}}
		addr := f.start(t)

		r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--timeout", "100ms")
		if r.code != exitFailure || r.stderr != tc.stderr {
			t.Errorf("%s: exit code %d, stderr %q; want 1, %q", tc.name, r.code, r.stderr, tc.stderr)
		}
	}
}

// cancelOnWrite is a writer that cancels a context on the first write, like an
// operator pressing Ctrl-C once the first message is on the screen.
type cancelOnWrite struct {
	mu     sync.Mutex
	buf    strings.Builder
	cancel context.CancelFunc
}

func (w *cancelOnWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel()
	return w.buf.Write(p)
}

func TestConsumeInterruptStillConfirmsAcks(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(true, delivery("m1", 1, "", "hello"))
	addr := f.start(t)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stdout := &cancelOnWrite{cancel: cancel}
	code := run(ctx, []string{"--addr", addr, "consume", "orders", "--group", "points", "--wait", "1h"}, func(string) string { return "" }, strings.NewReader(""), stdout, io.Discard)
	if code != exitOK || stdout.buf.String() != "m1  attempt=1  key=  hello\n" {
		t.Errorf("exit code %d, stdout %q", code, stdout.buf.String())
	}
	wantRequests(t, f, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 64), ack("m1"))
}

func TestTopics(t *testing.T) {
	topic := &txmqv1.Topic{Name: "orders", CreatedAt: created, FirstSequence: 3, LastSequence: 42, Messages: 40, Bytes: 81920, ConsumerGroups: []string{"points", "mail"}}
	f := &fakeBroker{
		createTopic: func(req *txmqv1.CreateTopicRequest) (*txmqv1.CreateTopicResponse, error) {
			return &txmqv1.CreateTopicResponse{Topic: &txmqv1.Topic{Name: req.GetName(), CreatedAt: created}, Created: req.GetName() == "orders"}, nil
		},
		listTopics: func(*txmqv1.ListTopicsRequest) (*txmqv1.ListTopicsResponse, error) {
			return &txmqv1.ListTopicsResponse{Topics: []*txmqv1.Topic{topic, {Name: "audit"}}}, nil
		},
	}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"topic", "create", "orders"}, "topic orders created\n"},
		{[]string{"topic", "create", "audit"}, "topic audit exists already\n"},
		{[]string{"topic", "create", "orders", "-o", "json"}, `{"topic":"orders","created_at":"2026-05-01T10:00:00.5Z","first_sequence":0,"last_sequence":0,"messages":0,"bytes":0,"consumer_groups":[],"created":true}` + "\n"},
		{[]string{"topic", "list"}, `TOPIC   CREATED               FIRST-SEQ  LAST-SEQ  MESSAGES  BYTES  CONSUMER-GROUPS
orders  2026-05-01T10:00:00Z  3          42        40        81920  points,mail
audit   -                     0          0         0         0      -
`},
		{[]string{"topic", "list", "-o", "json"}, `{"topic":"orders","created_at":"2026-05-01T10:00:00.5Z","first_sequence":3,"last_sequence":42,"messages":40,"bytes":81920,"consumer_groups":["points","mail"]}
{"topic":"audit","first_sequence":0,"last_sequence":0,"messages":0,"bytes":0,"consumer_groups":[]}
`},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.CreateTopicRequest{Name: "orders"},
		&txmqv1.CreateTopicRequest{Name: "audit"},
		&txmqv1.CreateTopicRequest{Name: "orders"},
		&txmqv1.ListTopicsRequest{},
		&txmqv1.ListTopicsRequest{})
}

func TestClusterStatus(t *testing.T) {
	f := &fakeBroker{clusterStatus: func(*txmqv1.ClusterStatusRequest) (*txmqv1.ClusterStatusResponse, error) {
		return &txmqv1.ClusterStatusResponse{
			NodeId: "n1", State: "LEADER", LeaderId: "n1", LeaderRaftAddress: "127.0.0.1:7421", LeaderAddress: "127.0.0.1:7420",
			Term: 3, CommitIndex: 10, AppliedIndex: 10, LastLogIndex: 11, StoreAppliedIndex: 9,
			Nodes: []*txmqv1.ClusterNode{
				{Id: "n1", RaftAddress: "127.0.0.1:7421", GrpcAddress: "127.0.0.1:7420", Suffrage: "VOTER", Leader: true,
					Reachable: true, State: "LEADER", AppliedIndex: 10},
				{Id: "n2", RaftAddress: "127.0.0.1:7431", GrpcAddress: "127.0.0.1:7430", Suffrage: "VOTER",
					Reachable: true, State: "FOLLOWER", AppliedIndex: 7, Lag: 3},
				{Id: "n3", RaftAddress: "127.0.0.1:7441", Suffrage: "STAGING"},
			},
		}, nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "cluster", "status")
	wantOK(t, r)
	want := `Node:                 n1
State:                LEADER
Leader:               n1 (127.0.0.1:7421)
Leader gRPC address:  127.0.0.1:7420
Term:                 3
Commit index:         10
Applied index:        10
Last log index:       11
Store applied index:  9

NODE-ID  RAFT-ADDRESS    GRPC-ADDRESS    SUFFRAGE  LEADER  STATE        APPLIED  LAG
n1       127.0.0.1:7421  127.0.0.1:7420  VOTER     true    LEADER       10       0
n2       127.0.0.1:7431  127.0.0.1:7430  VOTER     false   FOLLOWER     7        3
n3       127.0.0.1:7441  -               STAGING   false   unreachable  -        -
`
	if r.stdout != want {
		t.Errorf("table:\n%s\nwant:\n%s", r.stdout, want)
	}
	r = brokerctl(t, nil, "--addr", addr, "-o", "json", "cluster", "status")
	wantOK(t, r)
	want = `{"node_id":"n1","state":"LEADER","leader_id":"n1","leader_raft_address":"127.0.0.1:7421","leader_address":"127.0.0.1:7420","term":3,"commit_index":10,"applied_index":10,"last_log_index":11,"store_applied_index":9,"nodes":[{"id":"n1","raft_address":"127.0.0.1:7421","grpc_address":"127.0.0.1:7420","suffrage":"VOTER","leader":true,"reachable":true,"state":"LEADER","applied_index":10,"lag":0},{"id":"n2","raft_address":"127.0.0.1:7431","grpc_address":"127.0.0.1:7430","suffrage":"VOTER","leader":false,"reachable":true,"state":"FOLLOWER","applied_index":7,"lag":3},{"id":"n3","raft_address":"127.0.0.1:7441","grpc_address":"","suffrage":"STAGING","leader":false,"reachable":false,"applied_index":0,"lag":0}]}` + "\n"
	if r.stdout != want {
		t.Errorf("json %q, want %q", r.stdout, want)
	}
	wantRequests(t, f, &txmqv1.ClusterStatusRequest{}, &txmqv1.ClusterStatusRequest{})
}

func TestConsumeBrokerEndsStream(t *testing.T) {
	for _, tc := range []struct {
		confirm bool
		code    int
		stderr  string
	}{
		{confirm: true, code: exitOK},
		{confirm: false, code: exitFailure, stderr: "brokerctl: Unavailable: the broker ended the stream before confirming 1 ack(s); those messages may be delivered again\n"},
	} {
		f := &fakeBroker{subscribe: func(stream txmqv1.ConsumerService_SubscribeServer) error {
			if _, err := stream.Recv(); err != nil {
				return err
			}
			if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{}}}); err != nil {
				return err
			}
			d := delivery("m1", 1, "", "")
			d.Body = []byte{0xff}
			if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: d}}); err != nil {
				return err
			}
			req, err := stream.Recv()
			if err != nil || !tc.confirm {
				return err
			}
			return stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_AckConfirm{AckConfirm: &txmqv1.AckConfirm{
				MessageIds: req.GetAck().GetMessageIds(),
			}}})
		}}
		addr := f.start(t)

		r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--wait", "1h")
		if r.code != tc.code || r.stderr != tc.stderr {
			t.Errorf("confirm %t: exit code %d, stderr %q; want %d, %q", tc.confirm, r.code, r.stderr, tc.code, tc.stderr)
		}
		if r.stdout != "m1  attempt=1  key=  base64:/w==\n" {
			t.Errorf("confirm %t: stdout %q", tc.confirm, r.stdout)
		}
	}
}
