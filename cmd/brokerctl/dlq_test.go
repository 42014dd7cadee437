package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

var deadAt = timestamppb.New(time.Date(2026, 5, 1, 11, 30, 0, 0, time.UTC))

// deadLetter is message id of orders, dead in group points after 16
// attempts, as ListDeadLetters returns it: without its body.
func deadLetter(id string, seq uint64) *txmqv1.DeadLetter {
	return &txmqv1.DeadLetter{
		ConsumerGroup: "points", Topic: "orders", MessageId: id, Sequence: seq, Attempts: 16,
		LastError: "nacked by brokerctl consume --nack", DeadAt: deadAt, CommittedAt: created, BodySize: 10,
	}
}

func TestDLQListPages(t *testing.T) {
	longError := "handler: insert into points: pq: duplicate key value violates unique constraint \"points_pkey\""
	f := &fakeBroker{listDLQ: func(req *txmqv1.ListDeadLettersRequest) (*txmqv1.ListDeadLettersResponse, error) {
		if req.GetPageToken() == "" {
			keyed := deadLetter("m2", 8)
			keyed.Key = "order-42"
			keyed.OrderingKey = "customer-7"
			keyed.LastError = longError
			return &txmqv1.ListDeadLettersResponse{DeadLetters: []*txmqv1.DeadLetter{deadLetter("m1", 7), keyed}, NextPageToken: "page-2"}, nil
		}
		return &txmqv1.ListDeadLettersResponse{DeadLetters: []*txmqv1.DeadLetter{deadLetter("m3", 9)}}, nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "dlq", "list", "points")
	wantOK(t, r)
	want := `MSG-ID  TOPIC   SEQ  ATTEMPTS  DEAD-AT               LAST-ERROR                                KEY       ORDERING-KEY
m1      orders  7    16        2026-05-01T11:30:00Z  nacked by brokerctl consume --nack        -         -
m2      orders  8    16        2026-05-01T11:30:00Z  handler: insert into points: pq: dupl...  order-42  customer-7
m3      orders  9    16        2026-05-01T11:30:00Z  nacked by brokerctl consume --nack        -         -
`
	if r.stdout != want {
		t.Errorf("table:\n%s\nwant:\n%s", r.stdout, want)
	}

	// JSON has the whole error, and no body: the listing has none.
	r = brokerctl(t, nil, "--addr", addr, "dlq", "list", "points", "--topic", "orders", "--limit", "2", "-o", "json")
	wantOK(t, r)
	want = `{"consumer_group":"points","topic":"orders","id":"m1","sequence":7,"attempts":16,"last_error":"nacked by brokerctl consume --nack","dead_at":"2026-05-01T11:30:00Z","committed_at":"2026-05-01T10:00:00.5Z","key":"","ordering_key":"","properties":{},"body_size":10}
{"consumer_group":"points","topic":"orders","id":"m2","sequence":8,"attempts":16,"last_error":"handler: insert into points: pq: duplicate key value violates unique constraint \"points_pkey\"","dead_at":"2026-05-01T11:30:00Z","committed_at":"2026-05-01T10:00:00.5Z","key":"order-42","ordering_key":"customer-7","properties":{},"body_size":10}
`
	if r.stdout != want {
		t.Errorf("json:\n%s\nwant:\n%s", r.stdout, want)
	}
	wantRequests(t, f,
		&txmqv1.ListDeadLettersRequest{ConsumerGroup: "points", Limit: 100},
		&txmqv1.ListDeadLettersRequest{ConsumerGroup: "points", Limit: 100, PageToken: "page-2"},
		&txmqv1.ListDeadLettersRequest{ConsumerGroup: "points", Topic: "orders", Limit: 2})
}

func TestDLQListEmptyAndFailing(t *testing.T) {
	f := &fakeBroker{listDLQ: func(req *txmqv1.ListDeadLettersRequest) (*txmqv1.ListDeadLettersResponse, error) {
		switch req.GetConsumerGroup() {
		case "points":
			return &txmqv1.ListDeadLettersResponse{}, nil
		case "loop":
			return &txmqv1.ListDeadLettersResponse{DeadLetters: []*txmqv1.DeadLetter{deadLetter("m1", 1)}, NextPageToken: "same"}, nil
		}
		return nil, status.Errorf(codes.NotFound, "consumer group %s not found", req.GetConsumerGroup())
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "dlq", "list", "points")
	wantOK(t, r)
	if r.stdout != "MSG-ID  TOPIC  SEQ  ATTEMPTS  DEAD-AT  LAST-ERROR  KEY  ORDERING-KEY\n" {
		t.Errorf("empty listing printed %q, want the header alone", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "dlq", "list", "nobody")
	if r.code != exitFailure || r.stdout != "" || r.stderr != "brokerctl: NotFound: consumer group nobody not found\n" {
		t.Errorf("unknown group: exit code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// A repeated page token is the broker's bug: what was listed is
	// printed, then the error.
	r = brokerctl(t, nil, "--addr", addr, "dlq", "list", "loop")
	if r.code != exitFailure || strings.Count(r.stdout, "\n") != 3 || r.stderr != "brokerctl: Internal: the broker returned page token \"same\" twice\n" {
		t.Errorf("repeated token: exit code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestDLQShow(t *testing.T) {
	full := deadLetter("m1", 7)
	full.Key = "order-42"
	full.OrderingKey = "customer-7"
	full.Properties = map[string]string{"region": "eu", "channel": "web"}
	full.Body = []byte("order 42\tpaid")
	full.BodySize = 13
	full.ProducerGroup = "shop"
	full.TransactionId = "order-42:paid"
	binary := deadLetter("m2", 8)
	binary.Body = []byte{0xff, 0x00}
	binary.BodySize = 2
	binary.LastError = ""
	letters := map[string]*txmqv1.DeadLetter{"m1": full, "m2": binary}
	f := &fakeBroker{getDLQ: func(req *txmqv1.GetDeadLetterRequest) (*txmqv1.GetDeadLetterResponse, error) {
		dl, ok := letters[req.GetMessageId()]
		if !ok {
			return nil, status.Errorf(codes.NotFound, "no dead letter %s in group %s", req.GetMessageId(), req.GetConsumerGroup())
		}
		return &txmqv1.GetDeadLetterResponse{DeadLetter: dl}, nil
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "show", "points", "m1"}, `Message ID:      m1
Consumer group:  points
Topic:           orders
Sequence:        7
Attempts:        16
Dead at:         2026-05-01T11:30:00Z
Last error:      nacked by brokerctl consume --nack
Committed:       2026-05-01T10:00:00Z
Key:             order-42
Ordering key:    customer-7
Producer group:  shop
Transaction ID:  order-42:paid
Properties:      channel=web
                 region=eu
Body size:       13
Body:
order 42	paid
`},
		{[]string{"dlq", "show", "points", "m2"}, `Message ID:      m2
Consumer group:  points
Topic:           orders
Sequence:        8
Attempts:        16
Dead at:         2026-05-01T11:30:00Z
Last error:      -
Committed:       2026-05-01T10:00:00Z
Key:             -
Ordering key:    -
Producer group:  -
Transaction ID:  -
Properties:      -
Body size:       2
Body (base64):
/wA=
`},
		{[]string{"dlq", "show", "points", "m1", "-o", "json"}, `{"consumer_group":"points","topic":"orders","id":"m1","sequence":7,"attempts":16,"last_error":"nacked by brokerctl consume --nack","dead_at":"2026-05-01T11:30:00Z","committed_at":"2026-05-01T10:00:00.5Z","key":"order-42","ordering_key":"customer-7","properties":{"channel":"web","region":"eu"},"body":"order 42\tpaid","body_size":13,"producer_group":"shop","transaction_id":"order-42:paid"}` + "\n"},
		{[]string{"dlq", "show", "points", "m2", "-o", "json"}, `{"consumer_group":"points","topic":"orders","id":"m2","sequence":8,"attempts":16,"dead_at":"2026-05-01T11:30:00Z","committed_at":"2026-05-01T10:00:00.5Z","key":"","ordering_key":"","properties":{},"body_base64":"/wA=","body_size":2}` + "\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	r := brokerctl(t, nil, "--addr", addr, "dlq", "show", "points", "m9")
	if r.code != exitFailure || r.stderr != "brokerctl: NotFound: no dead letter m9 in group points\n" {
		t.Errorf("unknown ID: exit code %d, stderr %q", r.code, r.stderr)
	}
	wantRequests(t, f,
		&txmqv1.GetDeadLetterRequest{ConsumerGroup: "points", MessageId: "m1"},
		&txmqv1.GetDeadLetterRequest{ConsumerGroup: "points", MessageId: "m2"},
		&txmqv1.GetDeadLetterRequest{ConsumerGroup: "points", MessageId: "m1"},
		&txmqv1.GetDeadLetterRequest{ConsumerGroup: "points", MessageId: "m2"},
		&txmqv1.GetDeadLetterRequest{ConsumerGroup: "points", MessageId: "m9"})
}

func TestDLQRedriveAndPurge(t *testing.T) {
	f := &fakeBroker{
		redrive: func(req *txmqv1.RedriveDeadLettersRequest) (*txmqv1.RedriveDeadLettersResponse, error) {
			if req.GetAll() {
				return &txmqv1.RedriveDeadLettersResponse{Redriven: 12}, nil
			}
			return &txmqv1.RedriveDeadLettersResponse{Redriven: uint64(len(req.GetMessageIds()))}, nil
		},
		purge: func(req *txmqv1.PurgeDeadLettersRequest) (*txmqv1.PurgeDeadLettersResponse, error) {
			if req.GetAll() {
				return &txmqv1.PurgeDeadLettersResponse{Purged: 5}, nil
			}
			return &txmqv1.PurgeDeadLettersResponse{Purged: uint64(len(req.GetMessageIds()))}, nil
		},
	}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq", "redrive", "points", "m1", "m2"}, "2 dead letter(s) of group points redriven\n"},
		{[]string{"dlq", "redrive", "points", "--all", "--topic", "orders"}, "12 dead letter(s) of group points redriven\n"},
		{[]string{"dlq", "redrive", "points", "--all", "-o", "json"}, `{"consumer_group":"points","redriven":12}` + "\n"},
		{[]string{"dlq", "purge", "points", "m3", "-f"}, "1 dead letter(s) of group points purged\n"},
		{[]string{"dlq", "purge", "--all", "points", "--force"}, "5 dead letter(s) of group points purged\n"},
		{[]string{"dlq", "purge", "points", "m3", "m4", "-f", "-o", "json"}, `{"consumer_group":"points","purged":2}` + "\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed %q, want %q", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "points", MessageIds: []string{"m1", "m2"}},
		&txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "points", All: true, Topic: "orders"},
		&txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "points", All: true},
		&txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "points", MessageIds: []string{"m3"}},
		&txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "points", All: true},
		&txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "points", MessageIds: []string{"m3", "m4"}})
}

func TestDLQUsageErrors(t *testing.T) {
	f := &fakeBroker{}
	addr := f.start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"dlq"}, `"dlq" needs a subcommand`},
		{[]string{"dlq", "requeue", "points"}, `unknown command "dlq requeue"`},
		{[]string{"dlq", "list"}, "want 1 argument(s), GROUP; got 0"},
		{[]string{"dlq", "list", ""}, "GROUP must not be empty"},
		{[]string{"dlq", "list", "points", "--limit", "-1"}, `invalid value "-1" for flag -limit`},
		{[]string{"dlq", "show", "points"}, "want 2 argument(s), GROUP MSG_ID; got 1"},
		{[]string{"dlq", "show", "points", ""}, "GROUP and MSG_ID must not be empty"},
		{[]string{"dlq", "redrive"}, "want at least 1 argument(s), GROUP [MSG_ID...]; got 0"},
		{[]string{"dlq", "redrive", "points"}, "name the dead letters to redrive, or give --all for every one"},
		{[]string{"dlq", "redrive", "points", "--topic", "orders"}, "name the dead letters to redrive, or give --all for every one"},
		{[]string{"dlq", "redrive", "points", "m1", "--all"}, "give MSG_IDs or --all, not both"},
		{[]string{"dlq", "redrive", "points", "m1", "--topic", "orders"}, "--topic goes with --all; MSG_IDs name their messages already"},
		{[]string{"dlq", "redrive", "", "--all"}, "GROUP must not be empty"},
		{[]string{"dlq", "redrive", "points", "m1", ""}, "MSG_ID must not be empty"},
		{[]string{"dlq", "purge", "points"}, "name the dead letters to purge, or give --all for every one"},
		{[]string{"dlq", "purge", "points", "m1", "m2", "--all"}, "give MSG_IDs or --all, not both"},
		{[]string{"dlq", "purge", "points", "--all=false"}, "name the dead letters to purge, or give --all for every one"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) || !strings.Contains(r.stderr, "usage: brokerctl") || r.stdout != "" {
			t.Errorf("%q: exit code %d, stdout %q, stderr %q; want 2, %q and the usage on stderr", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
	if got := f.recorded(); len(got) != 0 {
		t.Errorf("usage errors reached the broker: %v", got)
	}
}
