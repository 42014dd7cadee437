package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func TestSendOrderingKey(t *testing.T) {
	f := &fakeBroker{
		send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			return &txmqv1.SendResponse{MessageId: "m1", Sequence: 1}, nil
		},
		sendHalf: func(*txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
			return &txmqv1.SendHalfResponse{MessageId: "m2", State: txmqv1.HalfState_HALF_STATE_PENDING}, nil
		},
	}
	addr := f.start(t)

	wantOK(t, brokerctl(t, nil, "--addr", addr, "send", "orders", "paid", "--ordering-key", "customer-7"))
	wantOK(t, brokerctl(t, nil, "--addr", addr, "half", "send", "orders", "paid", "--group", "shop", "--tx", "T", "--ordering-key=customer-7"))
	wantRequests(t, f,
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("paid"), OrderingKey: "customer-7"},
		&txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "T", Body: []byte("paid"), OrderingKey: "customer-7"})
}

func nack(id string, delay *durationpb.Duration) *txmqv1.SubscribeRequest {
	return &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Nack{Nack: &txmqv1.NackRequest{
		MessageIds: []string{id},
		Delay:      delay,
		Error:      "nacked by brokerctl consume --nack",
	}}}
}

// redelivered is a delivery of message id on its attempt, after a failed
// one, with an ordering key.
func redelivered(id string, attempt uint32) *txmqv1.Delivery {
	d := delivery(id, attempt, "k1", "hello")
	d.OrderingKey = "customer-7"
	d.LastError = "nacked by brokerctl consume --nack"
	d.AckDeadline = deadAt
	return d
}

func TestConsumeNack(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		delay *durationpb.Duration
	}{
		{nil, nil},
		{[]string{"--nack-delay", "0s"}, durationpb.New(0)},
		{[]string{"--nack-delay=1m30s"}, durationpb.New(90 * time.Second)},
	} {
		f := &fakeBroker{}
		f.serveDeliveries(true, redelivered("m1", 3), delivery("m2", 1, "", "plain"))
		addr := f.start(t)

		args := append([]string{"--addr", addr, "consume", "orders", "--group", "points", "--count", "2", "--nack"}, tc.args...)
		r := brokerctl(t, nil, args...)
		wantOK(t, r)
		want := `m1  attempt=3  key=k1  ordering-key=customer-7  last-error="nacked by brokerctl consume --nack"  hello` + "\nm2  attempt=1  key=  plain\n"
		if r.stdout != want {
			t.Errorf("%q printed %q, want %q", tc.args, r.stdout, want)
		}
		// Every nack reached the broker before consume ended the stream.
		wantRequests(t, f, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 2), nack("m1", tc.delay), nack("m2", tc.delay))
	}
}

func TestConsumeNackJSON(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(true, redelivered("m1", 16))
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "-o", "json", "consume", "orders", "--group", "points", "--count", "1", "--nack")
	wantOK(t, r)
	want := `{"id":"m1","topic":"orders","key":"k1","properties":{},"body":"hello","attempt":16,"sequence":26,"committed_at":"2026-05-01T10:00:00.5Z","ordering_key":"customer-7","ack_deadline":"2026-05-01T11:30:00Z","last_error":"nacked by brokerctl consume --nack"}` + "\n"
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	wantRequests(t, f, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 1), nack("m1", nil))
}

// A broker that keeps the stream open after consume closed its side: the
// nacks may not have been read, and consume says so after --timeout.
func TestConsumeNackStreamNotEnded(t *testing.T) {
	f := &fakeBroker{subscribe: func(stream txmqv1.ConsumerService_SubscribeServer) error {
		if _, err := stream.Recv(); err != nil {
			return err
		}
		if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{}}}); err != nil {
			return err
		}
		if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: delivery("m1", 1, "", "hello")}}); err != nil {
			return err
		}
		<-stream.Context().Done()
		return nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--count", "1", "--nack", "--timeout", "100ms")
	want := "brokerctl: DeadlineExceeded: the broker did not end the stream within 100ms; the last nacks may be lost, and those messages are redelivered once their ack deadline passes\n"
	if r.code != exitFailure || r.stderr != want || r.stdout != "m1  attempt=1  key=  hello\n" {
		t.Errorf("exit code %d, stdout %q, stderr %q; want 1, the message, %q", r.code, r.stdout, r.stderr, want)
	}
}

func TestConsumeStart(t *testing.T) {
	at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		args []string
		want *txmqv1.SubscriptionStart
	}{
		{[]string{"--start", "latest"}, &txmqv1.SubscriptionStart{StartPosition: txmqv1.StartPosition_START_POSITION_LATEST}},
		{[]string{"--from", "earliest"}, &txmqv1.SubscriptionStart{StartPosition: txmqv1.StartPosition_START_POSITION_EARLIEST}},
		{[]string{"--start", "2026-05-01T11:00:00+02:00"}, &txmqv1.SubscriptionStart{StartPosition: txmqv1.StartPosition_START_POSITION_TIMESTAMP, StartTime: timestamppb.New(at)}},
		{[]string{"--from", "2026-05-01T09:00:00Z"}, &txmqv1.SubscriptionStart{StartPosition: txmqv1.StartPosition_START_POSITION_TIMESTAMP, StartTime: timestamppb.New(at)}},
	} {
		f := &fakeBroker{}
		f.serveDeliveries(true)
		addr := f.start(t)

		wantOK(t, brokerctl(t, nil, append([]string{"--addr", addr, "consume", "orders", "--group", "points", "--wait", "10ms"}, tc.args...)...))
		tc.want.Topic, tc.want.ConsumerGroup, tc.want.MaxInFlight = "orders", "points", 64
		wantRequests(t, f, &txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: tc.want}})
	}
}

func TestConsumeStartRelative(t *testing.T) {
	f := &fakeBroker{}
	f.serveDeliveries(true)
	addr := f.start(t)

	before := time.Now()
	wantOK(t, brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--wait", "10ms", "--start", "-2h"))
	after := time.Now()
	got := f.recorded()
	if len(got) != 1 {
		t.Fatalf("broker got %v, want the subscription", got)
	}
	start := got[0].(*txmqv1.SubscribeRequest).GetStart()
	at := start.GetStartTime().AsTime()
	if start.GetStartPosition() != txmqv1.StartPosition_START_POSITION_TIMESTAMP || at.Before(before.Add(-2*time.Hour)) || at.After(after.Add(-2*time.Hour)) {
		t.Errorf("subscription %v: want TIMESTAMP 2h before the command ran", start)
	}
}

func TestConsumeUsageErrors(t *testing.T) {
	f := &fakeBroker{}
	addr := f.start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"consume", "orders", "--group", "g", "--nack-delay", "1s"}, "--nack-delay goes with --nack"},
		{[]string{"consume", "orders", "--group", "g", "--nack", "--nack-delay", "-1s"}, "--nack-delay must be between 0s and 12h0m0s, not -1s"},
		{[]string{"consume", "orders", "--group", "g", "--nack", "--nack-delay", "13h"}, "--nack-delay must be between 0s and 12h0m0s, not 13h0m0s"},
		{[]string{"consume", "orders", "--group", "g", "--start", "middle"}, `invalid value "middle" for flag -start: want earliest, latest, an RFC 3339 time`},
		{[]string{"consume", "orders", "--group", "g", "--start", "+1h"}, `invalid value "+1h" for flag -start`},
		{[]string{"send", "orders", "b", "--ordering-key"}, "flag needs an argument: -ordering-key"},
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
