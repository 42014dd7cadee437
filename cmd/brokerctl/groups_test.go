package main

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// defaultConsumerConfig is a consumer group's delivery policy with the
// broker's defaults, and a backoff schedule.
func defaultConsumerConfig(group string) *txmqv1.ConsumerGroupConfig {
	return &txmqv1.ConsumerGroupConfig{
		ConsumerGroup:     group,
		MaxDeliveries:     proto.Uint32(16),
		AckDeadline:       durationpb.New(30 * time.Second),
		RedeliveryBackoff: []*durationpb.Duration{durationpb.New(time.Second), durationpb.New(5 * time.Second), durationpb.New(time.Minute)},
		OrderedPoison:     txmqv1.OrderedPoison_ORDERED_POISON_SKIP,
	}
}

// mergeConsumerConfig applies the set fields of change to cfg, as the
// broker does.
func mergeConsumerConfig(cfg, change *txmqv1.ConsumerGroupConfig) *txmqv1.ConsumerGroupConfig {
	out := proto.CloneOf(cfg)
	if change.MaxDeliveries != nil {
		out.MaxDeliveries = proto.Uint32(change.GetMaxDeliveries())
	}
	if change.AckDeadline != nil {
		out.AckDeadline = change.GetAckDeadline()
	}
	if len(change.GetRedeliveryBackoff()) > 0 {
		out.RedeliveryBackoff = change.GetRedeliveryBackoff()
	}
	if change.OrderedPoison != txmqv1.OrderedPoison_ORDERED_POISON_UNSPECIFIED {
		out.OrderedPoison = change.GetOrderedPoison()
	}
	return out
}

// progress is a group's status on topic: behind by 3 for 3m12.4s, with
// retries and dead letters.
func progress(topic string) *txmqv1.GroupTopicStatus {
	return &txmqv1.GroupTopicStatus{
		Topic: topic, AckedThrough: 40, AckedAbove: 1, LastSequence: 43, Lag: 3, InFlight: 2, Subscribers: 1, CreatedAt: created,
		OldestUnackedAt: nextCheck, LagAge: durationpb.New(3*time.Minute + 12400*time.Millisecond),
		Redeliveries: 7, Retrying: 1, DeadLetters: 2, Dropped: 4, FirstSequence: 5,
	}
}

// caughtUp is a group's status on topic with nothing to do.
func caughtUp(topic string) *txmqv1.GroupTopicStatus {
	return &txmqv1.GroupTopicStatus{Topic: topic, AckedThrough: 9, LastSequence: 9, FirstSequence: 1, LagAge: durationpb.New(0)}
}

func TestGroupList(t *testing.T) {
	f := &fakeBroker{listGroups: func(*txmqv1.ListConsumerGroupsRequest) (*txmqv1.ListConsumerGroupsResponse, error) {
		return &txmqv1.ListConsumerGroupsResponse{Groups: []*txmqv1.DescribeConsumerGroupResponse{
			{ConsumerGroup: "points", Topics: []*txmqv1.GroupTopicStatus{progress("orders"), caughtUp("audit")}},
			{ConsumerGroup: "mail", Topics: []*txmqv1.GroupTopicStatus{caughtUp("orders")}},
			{ConsumerGroup: "idle"},
		}}, nil
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "list"}, `CONSUMER-GROUP  TOPIC   POSITION  LAST-SEQ  LAG  LAG-AGE  IN-FLIGHT  REDELIVERIES  RETRYING  DLQ  SUBSCRIBERS
points          orders  40        43        3    3m12s    2          7             1         2    1
points          audit   9         9         0    -        0          0             0         0    0
mail            orders  9         9         0    -        0          0             0         0    0
`},
		// A group of the topic that reads another one too: only the
		// topic asked for is shown.
		{[]string{"group", "list", "--topic", "orders", "-o", "json"}, `{"consumer_group":"points","topic":"orders","acked_through":40,"acked_above":1,"first_sequence":5,"last_sequence":43,"lag":3,"oldest_unacked_at":"2026-05-01T10:00:06Z","lag_age":"3m12.4s","in_flight":2,"redeliveries":7,"retrying":1,"dead_letters":2,"dropped":4,"subscribers":1,"created_at":"2026-05-01T10:00:00.5Z"}
{"consumer_group":"mail","topic":"orders","acked_through":9,"acked_above":0,"first_sequence":1,"last_sequence":9,"lag":0,"lag_age":"0s","in_flight":0,"redeliveries":0,"retrying":0,"dead_letters":0,"dropped":0,"subscribers":0}
`},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f, &txmqv1.ListConsumerGroupsRequest{}, &txmqv1.ListConsumerGroupsRequest{Topic: "orders"})
}

func TestGroupListEmpty(t *testing.T) {
	f := &fakeBroker{listGroups: func(*txmqv1.ListConsumerGroupsRequest) (*txmqv1.ListConsumerGroupsResponse, error) {
		return &txmqv1.ListConsumerGroupsResponse{}, nil
	}}
	addr := f.start(t)
	r := brokerctl(t, nil, "--addr", addr, "group", "list")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, "CONSUMER-GROUP") || strings.Count(r.stdout, "\n") != 1 {
		t.Errorf("stdout %q, want the header alone", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "group", "list", "-o", "json")
	wantOK(t, r)
	if r.stdout != "" {
		t.Errorf("json stdout %q, want nothing", r.stdout)
	}
}

func TestGroupDescribe(t *testing.T) {
	f := &fakeBroker{describeGroup: func(req *txmqv1.DescribeConsumerGroupRequest) (*txmqv1.DescribeConsumerGroupResponse, error) {
		resp := &txmqv1.DescribeConsumerGroupResponse{ConsumerGroup: req.GetConsumerGroup(), Topics: []*txmqv1.GroupTopicStatus{progress("orders"), caughtUp("audit")}}
		if req.GetConsumerGroup() == "points" {
			resp.Config = defaultConsumerConfig("points")
		}
		return resp, nil
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "describe", "points"}, `Consumer group:      points
Max deliveries:      16
Ack deadline:        30s
Redelivery backoff:  1s,5s,1m0s
Ordered poison:      SKIP

TOPIC   POSITION  LAST-SEQ  LAG  LAG-AGE  IN-FLIGHT  REDELIVERIES  RETRYING  DLQ  SUBSCRIBERS  FIRST-SEQ  DROPPED  CREATED
orders  40        43        3    3m12s    2          7             1         2    1            5          4        2026-05-01T10:00:00Z
audit   9         9         0    -        0          0             0         0    0            1          0        -
`},
		// A broker that sends no config: "-" in the table, no "config"
		// in JSON.
		{[]string{"group", "describe", "mail"}, `Consumer group:      mail
Max deliveries:      -
Ack deadline:        -
Redelivery backoff:  -
Ordered poison:      -

TOPIC   POSITION  LAST-SEQ  LAG  LAG-AGE  IN-FLIGHT  REDELIVERIES  RETRYING  DLQ  SUBSCRIBERS  FIRST-SEQ  DROPPED  CREATED
orders  40        43        3    3m12s    2          7             1         2    1            5          4        2026-05-01T10:00:00Z
audit   9         9         0    -        0          0             0         0    0            1          0        -
`},
		{[]string{"group", "describe", "points", "-o", "json"}, `{"consumer_group":"points","topics":[{"topic":"orders","acked_through":40,"acked_above":1,"first_sequence":5,"last_sequence":43,"lag":3,"oldest_unacked_at":"2026-05-01T10:00:06Z","lag_age":"3m12.4s","in_flight":2,"redeliveries":7,"retrying":1,"dead_letters":2,"dropped":4,"subscribers":1,"created_at":"2026-05-01T10:00:00.5Z"},{"topic":"audit","acked_through":9,"acked_above":0,"first_sequence":1,"last_sequence":9,"lag":0,"lag_age":"0s","in_flight":0,"redeliveries":0,"retrying":0,"dead_letters":0,"dropped":0,"subscribers":0}],"config":{"consumer_group":"points","max_deliveries":16,"ack_deadline":"30s","redelivery_backoff":["1s","5s","1m0s"],"ordered_poison":"SKIP"}}` + "\n"},
		{[]string{"group", "describe", "mail", "-o", "json"}, `{"consumer_group":"mail","topics":[{"topic":"orders","acked_through":40,"acked_above":1,"first_sequence":5,"last_sequence":43,"lag":3,"oldest_unacked_at":"2026-05-01T10:00:06Z","lag_age":"3m12.4s","in_flight":2,"redeliveries":7,"retrying":1,"dead_letters":2,"dropped":4,"subscribers":1,"created_at":"2026-05-01T10:00:00.5Z"},{"topic":"audit","acked_through":9,"acked_above":0,"first_sequence":1,"last_sequence":9,"lag":0,"lag_age":"0s","in_flight":0,"redeliveries":0,"retrying":0,"dead_letters":0,"dropped":0,"subscribers":0}]}` + "\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"},
		&txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "mail"},
		&txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"},
		&txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "mail"})
}

func TestHumanDuration(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0s"},
		{1500 * time.Microsecond, "2ms"},
		{999 * time.Millisecond, "999ms"},
		{time.Second, "1s"},
		{3*time.Minute + 12900*time.Millisecond, "3m12s"},
		{2 * time.Hour, "2h"},
		{time.Hour + 5*time.Second, "1h5s"},
		{75*time.Hour + 30*time.Minute, "75h30m"},
	} {
		if got := humanDuration(tc.in); got != tc.want {
			t.Errorf("humanDuration(%s) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A group that is a consumer group and a producer group shows both
// policies, labelled.
func TestGroupConfigShowBoth(t *testing.T) {
	f := &fakeBroker{
		getConsumer: func(req *txmqv1.GetConsumerGroupConfigRequest) (*txmqv1.GetConsumerGroupConfigResponse, error) {
			return &txmqv1.GetConsumerGroupConfigResponse{Config: defaultConsumerConfig(req.GetConsumerGroup())}, nil
		},
		getConfig: func(req *txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
			if req.GetProducerGroup() == "points" {
				return nil, status.Error(codes.NotFound, "producer group points not found")
			}
			return &txmqv1.GetProducerGroupConfigResponse{Config: defaultConfig(req.GetProducerGroup())}, nil
		},
	}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "config", "shop"}, `Consumer group (delivery):  shop
Max deliveries:             16
Ack deadline:               30s
Redelivery backoff:         1s,5s,1m0s
Ordered poison:             SKIP

Producer group (check-back):  shop
Max checks:                   15
Check backoff:                6s
Max check backoff:            1m0s
Max half age:                 24h0m0s
Expiry action:                PARK
Callback URL:                 -
`},
		{[]string{"group", "config", "shop", "-o", "json"}, `{"consumer_group":"shop","max_deliveries":16,"ack_deadline":"30s","redelivery_backoff":["1s","5s","1m0s"],"ordered_poison":"SKIP"}
{"producer_group":"shop","max_checks":15,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"PARK","callback_url":""}
`},
		// A consumer group only.
		{[]string{"group", "config", "points"}, `Consumer group:      points
Max deliveries:      16
Ack deadline:        30s
Redelivery backoff:  1s,5s,1m0s
Ordered poison:      SKIP
`},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "shop"},
		&txmqv1.GetProducerGroupConfigRequest{ProducerGroup: "shop"},
		&txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "shop"},
		&txmqv1.GetProducerGroupConfigRequest{ProducerGroup: "shop"},
		&txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "points"},
		&txmqv1.GetProducerGroupConfigRequest{ProducerGroup: "points"})
}

// Other errors than NotFound are not taken for "not a group of that kind".
func TestGroupConfigShowFails(t *testing.T) {
	f := &fakeBroker{
		getConsumer: func(*txmqv1.GetConsumerGroupConfigRequest) (*txmqv1.GetConsumerGroupConfigResponse, error) {
			return nil, status.Error(codes.InvalidArgument, `bad consumer group name "a b"`)
		},
		getConfig: func(req *txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
			return &txmqv1.GetProducerGroupConfigResponse{Config: defaultConfig(req.GetProducerGroup())}, nil
		},
	}
	addr := f.start(t)
	r := brokerctl(t, nil, "--addr", addr, "group", "config", "a b")
	if want := "brokerctl: InvalidArgument: bad consumer group name \"a b\"\n"; r.code != exitFailure || r.stderr != want || r.stdout != "" {
		t.Errorf("exit code %d, stdout %q, stderr %q; want 1, nothing, %q", r.code, r.stdout, r.stderr, want)
	}
}

func TestGroupConfigSetConsumer(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		want  *txmqv1.ConsumerGroupConfig
		table string
		json  string
	}{
		{
			args: []string{"--max-deliveries", "5"},
			want: &txmqv1.ConsumerGroupConfig{ConsumerGroup: "points", MaxDeliveries: proto.Uint32(5)},
			table: `Consumer group:      points
Max deliveries:      5
Ack deadline:        30s
Redelivery backoff:  1s,5s,1m0s
Ordered poison:      SKIP
`,
			json: `{"consumer_group":"points","max_deliveries":5,"ack_deadline":"30s","redelivery_backoff":["1s","5s","1m0s"],"ordered_poison":"SKIP"}`,
		},
		{
			args: []string{"--redelivery-backoff", "0s, 10s,2m", "--ordered-poison", "hold"},
			want: &txmqv1.ConsumerGroupConfig{
				ConsumerGroup:     "points",
				RedeliveryBackoff: []*durationpb.Duration{durationpb.New(0), durationpb.New(10 * time.Second), durationpb.New(2 * time.Minute)},
				OrderedPoison:     txmqv1.OrderedPoison_ORDERED_POISON_HOLD,
			},
			json: `{"consumer_group":"points","max_deliveries":16,"ack_deadline":"30s","redelivery_backoff":["0s","10s","2m0s"],"ordered_poison":"HOLD"}`,
		},
		{
			// The limits are allowed.
			args: []string{"--ack-deadline", "12h", "--max-deliveries", "1000", "--redelivery-backoff", "12h", "--ordered-poison", "skip"},
			want: &txmqv1.ConsumerGroupConfig{
				ConsumerGroup:     "points",
				MaxDeliveries:     proto.Uint32(1000),
				AckDeadline:       durationpb.New(12 * time.Hour),
				RedeliveryBackoff: []*durationpb.Duration{durationpb.New(12 * time.Hour)},
				OrderedPoison:     txmqv1.OrderedPoison_ORDERED_POISON_SKIP,
			},
			json: `{"consumer_group":"points","max_deliveries":1000,"ack_deadline":"12h0m0s","redelivery_backoff":["12h0m0s"],"ordered_poison":"SKIP"}`,
		},
		{
			args: []string{"--ack-deadline=1s", "--max-deliveries=1"},
			want: &txmqv1.ConsumerGroupConfig{ConsumerGroup: "points", MaxDeliveries: proto.Uint32(1), AckDeadline: durationpb.New(time.Second)},
			json: `{"consumer_group":"points","max_deliveries":1,"ack_deadline":"1s","redelivery_backoff":["1s","5s","1m0s"],"ordered_poison":"SKIP"}`,
		},
	} {
		f := &fakeBroker{setConsumer: func(req *txmqv1.SetConsumerGroupConfigRequest) (*txmqv1.SetConsumerGroupConfigResponse, error) {
			return &txmqv1.SetConsumerGroupConfigResponse{Config: mergeConsumerConfig(defaultConsumerConfig(req.GetConfig().GetConsumerGroup()), req.GetConfig())}, nil
		}}
		addr := f.start(t)

		r := brokerctl(t, nil, append(append([]string{"--addr", addr, "group", "config"}, tc.args...), "points")...)
		wantOK(t, r)
		if tc.table != "" && r.stdout != tc.table {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.table)
		}
		r = brokerctl(t, nil, append([]string{"--addr", addr, "group", "config", "points", "-o", "json"}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.json+"\n" {
			t.Errorf("%q printed json %q, want %q", tc.args, r.stdout, tc.json)
		}
		wantRequests(t, f, &txmqv1.SetConsumerGroupConfigRequest{Config: tc.want}, &txmqv1.SetConsumerGroupConfigRequest{Config: tc.want})
	}
}

func TestGroupConfigSetBoth(t *testing.T) {
	f := &fakeBroker{
		setConsumer: func(req *txmqv1.SetConsumerGroupConfigRequest) (*txmqv1.SetConsumerGroupConfigResponse, error) {
			return &txmqv1.SetConsumerGroupConfigResponse{Config: mergeConsumerConfig(defaultConsumerConfig("shop"), req.GetConfig())}, nil
		},
		setConfig: func(req *txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
			return &txmqv1.SetProducerGroupConfigResponse{Config: mergeConfig(defaultConfig("shop"), req.GetConfig())}, nil
		},
	}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "group", "config", "shop", "--max-checks", "3", "--ack-deadline", "1m")
	wantOK(t, r)
	want := `Consumer group (delivery):  shop
Max deliveries:             16
Ack deadline:               1m0s
Redelivery backoff:         1s,5s,1m0s
Ordered poison:             SKIP

Producer group (check-back):  shop
Max checks:                   3
Check backoff:                6s
Max check backoff:            1m0s
Max half age:                 24h0m0s
Expiry action:                PARK
Callback URL:                 -
`
	if r.stdout != want {
		t.Errorf("printed:\n%s\nwant:\n%s", r.stdout, want)
	}
	wantRequests(t, f,
		&txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{ConsumerGroup: "shop", AckDeadline: durationpb.New(time.Minute)}},
		&txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", MaxChecks: proto.Uint32(3)}})
}

// When the second change fails, the first, which took effect, is printed
// before the error.
func TestGroupConfigSetBothSecondFails(t *testing.T) {
	f := &fakeBroker{
		setConsumer: func(req *txmqv1.SetConsumerGroupConfigRequest) (*txmqv1.SetConsumerGroupConfigResponse, error) {
			return &txmqv1.SetConsumerGroupConfigResponse{Config: mergeConsumerConfig(defaultConsumerConfig("shop"), req.GetConfig())}, nil
		},
		setConfig: func(*txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "check_backoff 2m0s is above max_check_backoff 1m0s")
		},
	}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "-o", "json", "group", "config", "shop", "--check-backoff", "2m", "--ordered-poison", "hold")
	if want := "brokerctl: FailedPrecondition: check_backoff 2m0s is above max_check_backoff 1m0s\n"; r.code != exitFailure || r.stderr != want {
		t.Errorf("exit code %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
	if want := `{"consumer_group":"shop","max_deliveries":16,"ack_deadline":"30s","redelivery_backoff":["1s","5s","1m0s"],"ordered_poison":"HOLD"}` + "\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
}

func TestGroupReset(t *testing.T) {
	f := &fakeBroker{resetGroup: func(req *txmqv1.ResetConsumerGroupRequest) (*txmqv1.ResetConsumerGroupResponse, error) {
		return &txmqv1.ResetConsumerGroupResponse{DryRun: req.GetDryRun(), Topics: []*txmqv1.GroupReset{
			{Topic: "orders", OldAckedThrough: 40, NewAckedThrough: 4, LagBefore: 3, LagAfter: 39},
			{Topic: "audit", OldAckedThrough: 9, NewAckedThrough: 0, LagBefore: 0, LagAfter: 9},
		}}, nil
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "reset", "points", "--to", "earliest", "--dry-run"}, `TOPIC   OLD-POSITION  NEW-POSITION  LAG-BEFORE  LAG-AFTER
orders  40            4             3           39
audit   9             0             0           9
Dry run: nothing changed. Without --dry-run, the connected subscribers of group points are disconnected and resubscribe at the new position.
`},
		{[]string{"group", "reset", "points", "--to", "2026-05-01T10:00:00+02:00", "--topic", "orders", "-f"}, `TOPIC   OLD-POSITION  NEW-POSITION  LAG-BEFORE  LAG-AFTER
orders  40            4             3           39
audit   9             0             0           9
Group points reset on 2 topic(s). Its connected subscribers were disconnected and resubscribe at the new position.
`},
		{[]string{"-o", "json", "group", "reset", "points", "--to", "latest", "--dry-run"}, `{"consumer_group":"points","topic":"orders","old_acked_through":40,"new_acked_through":4,"lag_before":3,"lag_after":39,"dry_run":true}
{"consumer_group":"points","topic":"audit","old_acked_through":9,"new_acked_through":0,"lag_before":0,"lag_after":9,"dry_run":true}
`},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "points", To: txmqv1.StartPosition_START_POSITION_EARLIEST, DryRun: true},
		&txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "points", Topic: "orders", To: txmqv1.StartPosition_START_POSITION_TIMESTAMP,
			Time: timestamppb.New(time.Date(2026, 5, 1, 8, 0, 0, 0, time.UTC))},
		&txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "points", To: txmqv1.StartPosition_START_POSITION_LATEST, DryRun: true})
}

func TestGroupResetRelativeTime(t *testing.T) {
	f := &fakeBroker{resetGroup: func(req *txmqv1.ResetConsumerGroupRequest) (*txmqv1.ResetConsumerGroupResponse, error) {
		return &txmqv1.ResetConsumerGroupResponse{DryRun: req.GetDryRun()}, nil
	}}
	addr := f.start(t)

	before := time.Now()
	r := brokerctl(t, nil, "--addr", addr, "group", "reset", "points", "--to", "-1h30m", "--dry-run")
	after := time.Now()
	wantOK(t, r)
	got := f.recorded()
	if len(got) != 1 {
		t.Fatalf("broker got %v, want one reset", got)
	}
	req := got[0].(*txmqv1.ResetConsumerGroupRequest)
	at := req.GetTime().AsTime()
	if req.GetTo() != txmqv1.StartPosition_START_POSITION_TIMESTAMP || at.Before(before.Add(-90*time.Minute)) || at.After(after.Add(-90*time.Minute)) {
		t.Errorf("request %v: want TIMESTAMP 1h30m before the command ran", req)
	}
}

// Bad values of the new group commands are usage errors that say what is
// wrong, and reach no broker.
func TestGroupUsageErrors(t *testing.T) {
	f := &fakeBroker{}
	addr := f.start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "list", "points"}, `unexpected argument "points"`},
		{[]string{"group", "describe", "a", "b"}, "want 1 argument(s), GROUP; got 2"},
		{[]string{"group", "reset"}, "want 1 argument(s), GROUP; got 0"},
		{[]string{"group", "reset", "points"}, "--to is required"},
		{[]string{"group", "reset", "", "--to", "latest"}, "GROUP must not be empty"},
		{[]string{"group", "reset", "points", "--to", "yesterday"}, `invalid value "yesterday" for flag -to: want earliest, latest, an RFC 3339 time`},
		{[]string{"group", "reset", "points", "--to", "oldest"}, `invalid value "oldest" for flag -to`},
		{[]string{"group", "reset", "points", "--to", "1h"}, `invalid value "1h" for flag -to: want earliest, latest, an RFC 3339 time such as 2026-05-01T10:00:00Z, or a negative duration such as -1h`},
		{[]string{"group", "reset", "points", "--to", "2026-05-01 10:00"}, `invalid value "2026-05-01 10:00" for flag -to`},
		{[]string{"group", "config", "points", "--max-deliveries", "0"}, "--max-deliveries must be between 1 and 1000, not 0"},
		{[]string{"group", "config", "points", "--max-deliveries", "1001"}, "--max-deliveries must be between 1 and 1000, not 1001"},
		{[]string{"group", "config", "points", "--ack-deadline", "999ms"}, "--ack-deadline must be between 1s and 12h0m0s, not 999ms"},
		{[]string{"group", "config", "points", "--ack-deadline", "12h1s"}, "--ack-deadline must be between 1s and 12h0m0s, not 12h0m1s"},
		{[]string{"group", "config", "points", "--redelivery-backoff", ""}, `invalid value "" for flag -redelivery-backoff: want durations separated by commas, such as 1s,5s,30s`},
		{[]string{"group", "config", "points", "--redelivery-backoff", "1s,,5s"}, `want durations separated by commas, such as 1s,5s,30s: "" is not a duration`},
		{[]string{"group", "config", "points", "--redelivery-backoff", "1s,soon"}, `"soon" is not a duration`},
		{[]string{"group", "config", "points", "--redelivery-backoff", "1s,-5s"}, "--redelivery-backoff: delay 2 (-5s) must be between 0s and 12h0m0s"},
		{[]string{"group", "config", "points", "--redelivery-backoff", "13h"}, "--redelivery-backoff: delay 1 (13h0m0s) must be between 0s and 12h0m0s"},
		{[]string{"group", "config", "points", "--ordered-poison", "drop"}, `--ordered-poison must be skip or hold, not "drop"`},
		// A valid producer setting does not excuse an invalid consumer one,
		// nor the reverse.
		{[]string{"group", "config", "shop", "--max-checks", "3", "--max-deliveries", "0"}, "--max-deliveries must be between 1 and 1000, not 0"},
		{[]string{"group", "config", "shop", "--max-deliveries", "3", "--expiry", "drop"}, `--expiry must be park or rollback, not "drop"`},
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
