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

func TestHalfCheck(t *testing.T) {
	f := &fakeBroker{checkHalf: func(req *txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error) {
		m := pending(req.GetMessageId())
		switch req.GetMessageId() {
		case "m1":
			m.Body = nil
			m.State = txmqv1.HalfState_HALF_STATE_COMMITTED
			m.ResolvedAt = nextCheck
			m.ResolutionSource = txmqv1.ResolutionSource_RESOLUTION_SOURCE_CHECKBACK
			m.Sequence = 7
			m.CheckAttempts = 3
			m.NextCheckAt = nil
			return &txmqv1.CheckHalfMessageResponse{
				Answer:     txmqv1.Resolution_RESOLUTION_COMMIT,
				InstanceId: "shop-1",
				Endpoint:   "grpc://10.0.0.7:9000",
				Message:    m,
			}, nil
		default:
			m.LastCheckError = "no instance of producer group shop is registered"
			return &txmqv1.CheckHalfMessageResponse{
				Error:   "no instance of producer group shop is registered",
				Message: m,
			}, nil
		}
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"half", "check", "m1"}, `Message ID:      m1
Answer:          COMMIT
Error:           -
Instance:        shop-1
Endpoint:        grpc://10.0.0.7:9000
State:           COMMITTED
Check attempts:  3
Next check:      -
`},
		{[]string{"half", "check", "m2"}, `Message ID:      m2
Answer:          -
Error:           no instance of producer group shop is registered
Instance:        -
Endpoint:        -
State:           PENDING
Check attempts:  2
Next check:      2026-05-01T10:00:06Z
`},
		{[]string{"half", "check", "m1", "-o", "json"}, `{"answer":"COMMIT","instance_id":"shop-1","endpoint":"grpc://10.0.0.7:9000","message":{"id":"m1","topic":"orders","producer_group":"shop","transaction_id":"tx-m1","key":"","properties":{},"body_size":10,"state":"COMMITTED","created_at":"2026-05-01T10:00:00.5Z","resolved_at":"2026-05-01T10:00:06Z","resolution_source":"CHECKBACK","sequence":7,"check_attempts":3}}` + "\n"},
		{[]string{"-o", "json", "half", "check", "m2"}, `{"instance_id":"","endpoint":"","error":"no instance of producer group shop is registered","message":{"id":"m2","topic":"orders","producer_group":"shop","transaction_id":"tx-m2","key":"","properties":{},"body":"order paid","body_size":10,"state":"PENDING","created_at":"2026-05-01T10:00:00.5Z","sequence":0,"check_attempts":2,"next_check_at":"2026-05-01T10:00:06Z","last_check_error":"no instance of producer group shop is registered"}}` + "\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.CheckHalfMessageRequest{MessageId: "m1"},
		&txmqv1.CheckHalfMessageRequest{MessageId: "m2"},
		&txmqv1.CheckHalfMessageRequest{MessageId: "m1"},
		&txmqv1.CheckHalfMessageRequest{MessageId: "m2"})
}

func TestHalfCheckUnknown(t *testing.T) {
	f := &fakeBroker{checkHalf: func(req *txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error) {
		m := pending(req.GetMessageId())
		m.CheckAttempts = 3
		return &txmqv1.CheckHalfMessageResponse{
			Answer:     txmqv1.Resolution_RESOLUTION_UNKNOWN,
			InstanceId: "shop-2",
			Endpoint:   "http://10.0.0.8/txmq/check",
			Message:    m,
		}, nil
	}}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "half", "check", "m1", "-o", "json")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, `{"answer":"UNKNOWN","instance_id":"shop-2","endpoint":"http://10.0.0.8/txmq/check","message":{"id":"m1",`) {
		t.Errorf("json printed %q", r.stdout)
	}
}

func producers() []*txmqv1.ProducerInstance {
	registered := timestamppb.New(time.Date(2026, 5, 1, 9, 0, 0, 250_000_000, time.UTC))
	heartbeat := timestamppb.New(time.Date(2026, 5, 1, 10, 0, 3, 0, time.UTC))
	lease := timestamppb.New(time.Date(2026, 5, 1, 10, 0, 13, 0, time.UTC))
	return []*txmqv1.ProducerInstance{
		{
			ProducerGroup:  "shop",
			InstanceId:     "shop-1",
			Endpoint:       &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "10.0.0.7:9000"}},
			RegisteredAt:   registered,
			LastHeartbeat:  heartbeat,
			LeaseExpiresAt: lease,
		},
		{
			ProducerGroup:  "billing",
			InstanceId:     "billing-a",
			Endpoint:       &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: "https://billing.internal/txmq/check"}},
			RegisteredAt:   registered,
			LastHeartbeat:  heartbeat,
			LeaseExpiresAt: lease,
		},
		{ProducerGroup: "legacy", InstanceId: "old"},
	}
}

func TestProducerList(t *testing.T) {
	f := &fakeBroker{listProducers: func(req *txmqv1.ListProducersRequest) (*txmqv1.ListProducersResponse, error) {
		if req.GetProducerGroup() == "nobody" {
			return &txmqv1.ListProducersResponse{}, nil
		}
		return &txmqv1.ListProducersResponse{Instances: producers()}, nil
	}}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"producer", "list"}, `PRODUCER-GROUP  INSTANCE   ENDPOINT                             REGISTERED            LAST-HEARTBEAT        LEASE-EXPIRES
shop            shop-1     grpc://10.0.0.7:9000                 2026-05-01T09:00:00Z  2026-05-01T10:00:03Z  2026-05-01T10:00:13Z
billing         billing-a  https://billing.internal/txmq/check  2026-05-01T09:00:00Z  2026-05-01T10:00:03Z  2026-05-01T10:00:13Z
legacy          old        -                                    -                     -                     -
`},
		{[]string{"producer", "list", "--group", "shop", "-o", "json"}, `{"producer_group":"shop","instance_id":"shop-1","endpoint":{"grpc_address":"10.0.0.7:9000"},"registered_at":"2026-05-01T09:00:00.25Z","last_heartbeat":"2026-05-01T10:00:03Z","lease_expires_at":"2026-05-01T10:00:13Z"}
{"producer_group":"billing","instance_id":"billing-a","endpoint":{"http_url":"https://billing.internal/txmq/check"},"registered_at":"2026-05-01T09:00:00.25Z","last_heartbeat":"2026-05-01T10:00:03Z","lease_expires_at":"2026-05-01T10:00:13Z"}
{"producer_group":"legacy","instance_id":"old","endpoint":{}}
`},
		{[]string{"producer", "list", "--group=nobody"}, "PRODUCER-GROUP  INSTANCE  ENDPOINT  REGISTERED  LAST-HEARTBEAT  LEASE-EXPIRES\n"},
		{[]string{"producer", "list", "--group=nobody", "-o", "json"}, ""},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.want)
		}
	}
	wantRequests(t, f,
		&txmqv1.ListProducersRequest{},
		&txmqv1.ListProducersRequest{ProducerGroup: "shop"},
		&txmqv1.ListProducersRequest{ProducerGroup: "nobody"},
		&txmqv1.ListProducersRequest{ProducerGroup: "nobody"})
}

// defaultConfig is a producer group's configuration with the broker's
// defaults.
func defaultConfig(group string) *txmqv1.ProducerGroupConfig {
	return &txmqv1.ProducerGroupConfig{
		ProducerGroup:   group,
		MaxChecks:       proto.Uint32(15),
		CheckBackoff:    durationpb.New(6 * time.Second),
		MaxCheckBackoff: durationpb.New(60 * time.Second),
		MaxHalfAge:      durationpb.New(24 * time.Hour),
		ExpiryAction:    txmqv1.ExpiryAction_EXPIRY_ACTION_PARK,
		CallbackUrl:     proto.String(""),
	}
}

// mergeConfig applies the set fields of change to cfg, as the broker does.
func mergeConfig(cfg, change *txmqv1.ProducerGroupConfig) *txmqv1.ProducerGroupConfig {
	out := proto.CloneOf(cfg)
	if change.MaxChecks != nil {
		out.MaxChecks = proto.Uint32(change.GetMaxChecks())
	}
	if change.CheckBackoff != nil {
		out.CheckBackoff = change.GetCheckBackoff()
	}
	if change.MaxCheckBackoff != nil {
		out.MaxCheckBackoff = change.GetMaxCheckBackoff()
	}
	if change.MaxHalfAge != nil {
		out.MaxHalfAge = change.GetMaxHalfAge()
	}
	if change.ExpiryAction != txmqv1.ExpiryAction_EXPIRY_ACTION_UNSPECIFIED {
		out.ExpiryAction = change.GetExpiryAction()
	}
	if change.CallbackUrl != nil {
		out.CallbackUrl = proto.String(change.GetCallbackUrl())
	}
	return out
}

// noConsumerGroup answers GetConsumerGroupConfig as the broker does for a
// name that is a producer group only.
func noConsumerGroup(req *txmqv1.GetConsumerGroupConfigRequest) (*txmqv1.GetConsumerGroupConfigResponse, error) {
	return nil, status.Errorf(codes.NotFound, "consumer group %s not found", req.GetConsumerGroup())
}

// A producer group that is not a consumer group too shows its check-back
// policy alone, as before consumer groups had a policy.
func TestGroupConfigShow(t *testing.T) {
	f := &fakeBroker{getConfig: func(req *txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
		cfg := defaultConfig(req.GetProducerGroup())
		if req.GetProducerGroup() == "billing" {
			cfg.CallbackUrl = proto.String("https://billing.internal/txmq/check")
			cfg.ExpiryAction = txmqv1.ExpiryAction_EXPIRY_ACTION_ROLLBACK
		}
		return &txmqv1.GetProducerGroupConfigResponse{Config: cfg}, nil
	}, getConsumer: noConsumerGroup}
	addr := f.start(t)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"group", "config", "shop"}, `Producer group:     shop
Max checks:         15
Check backoff:      6s
Max check backoff:  1m0s
Max half age:       24h0m0s
Expiry action:      PARK
Callback URL:       -
`},
		{[]string{"group", "config", "billing", "-o", "json"}, `{"producer_group":"billing","max_checks":15,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"ROLLBACK","callback_url":"https://billing.internal/txmq/check"}` + "\n"},
		// Global flags are not settings: still a Get.
		{[]string{"-o", "json", "group", "config", "shop", "--timeout", "5s"}, `{"producer_group":"shop","max_checks":15,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"PARK","callback_url":""}` + "\n"},
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
		&txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "billing"},
		&txmqv1.GetProducerGroupConfigRequest{ProducerGroup: "billing"},
		&txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "shop"},
		&txmqv1.GetProducerGroupConfigRequest{ProducerGroup: "shop"})
}

func TestGroupConfigShowPartial(t *testing.T) {
	// A field the broker leaves unset is "-" in the table and absent in JSON.
	f := &fakeBroker{getConfig: func(req *txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
		return &txmqv1.GetProducerGroupConfigResponse{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: req.GetProducerGroup()}}, nil
	}, getConsumer: noConsumerGroup}
	addr := f.start(t)

	r := brokerctl(t, nil, "--addr", addr, "group", "config", "shop")
	wantOK(t, r)
	want := `Producer group:     shop
Max checks:         -
Check backoff:      -
Max check backoff:  -
Max half age:       -
Expiry action:      -
Callback URL:       -
`
	if r.stdout != want {
		t.Errorf("table:\n%s\nwant:\n%s", r.stdout, want)
	}
	r = brokerctl(t, nil, "--addr", addr, "group", "config", "shop", "-o", "json")
	wantOK(t, r)
	if want := `{"producer_group":"shop"}` + "\n"; r.stdout != want {
		t.Errorf("json %q, want %q", r.stdout, want)
	}
}

func TestGroupConfigSet(t *testing.T) {
	for _, tc := range []struct {
		args  []string
		want  *txmqv1.ProducerGroupConfig
		table string
		json  string
	}{
		{
			args: []string{"--max-checks", "5"},
			want: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", MaxChecks: proto.Uint32(5)},
			table: `Producer group:     shop
Max checks:         5
Check backoff:      6s
Max check backoff:  1m0s
Max half age:       24h0m0s
Expiry action:      PARK
Callback URL:       -
`,
			json: `{"producer_group":"shop","max_checks":5,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"PARK","callback_url":""}`,
		},
		{
			args: []string{"--expiry", "rollback", "--callback", "grpc://10.0.0.9:9000"},
			want: &txmqv1.ProducerGroupConfig{
				ProducerGroup: "shop",
				ExpiryAction:  txmqv1.ExpiryAction_EXPIRY_ACTION_ROLLBACK,
				CallbackUrl:   proto.String("grpc://10.0.0.9:9000"),
			},
			json: `{"producer_group":"shop","max_checks":15,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"ROLLBACK","callback_url":"grpc://10.0.0.9:9000"}`,
		},
		{
			// --callback "" clears the URL: the field is present and empty.
			args: []string{"--callback", ""},
			want: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", CallbackUrl: proto.String("")},
			json: `{"producer_group":"shop","max_checks":15,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"PARK","callback_url":""}`,
		},
		{
			// Enum values are read case-insensitively: PARK, as printed.
			args: []string{"--callback=", "--expiry=PARK"},
			want: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", CallbackUrl: proto.String(""), ExpiryAction: txmqv1.ExpiryAction_EXPIRY_ACTION_PARK},
			json: `{"producer_group":"shop","max_checks":15,"check_backoff":"6s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"PARK","callback_url":""}`,
		},
		{
			args: []string{"--check-backoff", "2s", "--max-check-backoff", "30s", "--max-half-age", "2h", "--max-checks", "40", "--callback", "https://shop.internal/check"},
			want: &txmqv1.ProducerGroupConfig{
				ProducerGroup:   "shop",
				MaxChecks:       proto.Uint32(40),
				CheckBackoff:    durationpb.New(2 * time.Second),
				MaxCheckBackoff: durationpb.New(30 * time.Second),
				MaxHalfAge:      durationpb.New(2 * time.Hour),
				CallbackUrl:     proto.String("https://shop.internal/check"),
			},
			table: `Producer group:     shop
Max checks:         40
Check backoff:      2s
Max check backoff:  30s
Max half age:       2h0m0s
Expiry action:      PARK
Callback URL:       https://shop.internal/check
`,
			json: `{"producer_group":"shop","max_checks":40,"check_backoff":"2s","max_check_backoff":"30s","max_half_age":"2h0m0s","expiry_action":"PARK","callback_url":"https://shop.internal/check"}`,
		},
		{
			// Only one of the two backoffs: no local comparison, the broker
			// judges it against the value in force.
			args: []string{"--check-backoff", "90s"},
			want: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", CheckBackoff: durationpb.New(90 * time.Second)},
			json: `{"producer_group":"shop","max_checks":15,"check_backoff":"1m30s","max_check_backoff":"1m0s","max_half_age":"24h0m0s","expiry_action":"PARK","callback_url":""}`,
		},
	} {
		f := &fakeBroker{setConfig: func(req *txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
			return &txmqv1.SetProducerGroupConfigResponse{Config: mergeConfig(defaultConfig(req.GetConfig().GetProducerGroup()), req.GetConfig())}, nil
		}}
		addr := f.start(t)

		// Flags before and after the group name.
		r := brokerctl(t, nil, append(append([]string{"--addr", addr, "group", "config"}, tc.args...), "shop")...)
		wantOK(t, r)
		if tc.table != "" && r.stdout != tc.table {
			t.Errorf("%q printed:\n%s\nwant:\n%s", tc.args, r.stdout, tc.table)
		}
		r = brokerctl(t, nil, append([]string{"--addr", addr, "group", "config", "shop", "-o", "json"}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.json+"\n" {
			t.Errorf("%q printed json %q, want %q", tc.args, r.stdout, tc.json)
		}
		wantRequests(t, f, &txmqv1.SetProducerGroupConfigRequest{Config: tc.want}, &txmqv1.SetProducerGroupConfigRequest{Config: tc.want})
	}
}

func TestCheckBackUsageErrors(t *testing.T) {
	f := &fakeBroker{}
	addr := f.start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"half", "check"}, "want 1 argument(s), MSG_ID; got 0"},
		{[]string{"half", "check", "m1", "m2"}, "want 1 argument(s), MSG_ID; got 2"},
		{[]string{"half", "send", "orders", "b", "--group", "G", "--tx", "T", "--check-after", "0s"}, "--check-after must be positive, not 0s"},
		{[]string{"half", "send", "orders", "b", "--group", "G", "--tx", "T", "--check-after", "-5s"}, "--check-after must be positive, not -5s"},
		{[]string{"producer"}, `"producer" needs a subcommand`},
		{[]string{"producer", "list", "extra"}, `unexpected argument "extra"`},
		{[]string{"producer", "list", "--state", "x"}, "flag provided but not defined: -state"},
		{[]string{"group", "config"}, "want 1 argument(s), GROUP; got 0"},
		{[]string{"group", "config", "a", "b"}, "want 1 argument(s), GROUP; got 2"},
		{[]string{"group", "config", "shop", "--expiry", "drop"}, `--expiry must be park or rollback, not "drop"`},
		{[]string{"group", "config", "shop", "--expiry", ""}, `--expiry must be park or rollback, not ""`},
		{[]string{"group", "config", "shop", "--expiry", "parked"}, `--expiry must be park or rollback, not "parked"`},
		{[]string{"group", "config", "shop", "--callback", "shop.internal:9000"}, `--callback "shop.internal:9000": want an http://, https:// or grpc:// URL, or "" to clear it`},
		{[]string{"group", "config", "shop", "--callback", "ftp://shop.internal/"}, `--callback "ftp://shop.internal/": want an http://, https:// or grpc:// URL`},
		{[]string{"group", "config", "shop", "--callback", "http://"}, `--callback "http://": the URL has no host`},
		{[]string{"group", "config", "shop", "--callback", "grpc://[::1"}, `--callback "grpc://[::1": missing ']' in host`},
		{[]string{"group", "config", "shop", "--callback", "grpc://shop.internal"}, `--callback "grpc://shop.internal": want grpc://host:port`},
		{[]string{"group", "config", "shop", "--callback", "grpc://shop.internal:9000/check"}, `--callback "grpc://shop.internal:9000/check": want grpc://host:port`},
		{[]string{"group", "config", "shop", "--check-backoff", "0s"}, "--check-backoff must be positive, not 0s"},
		{[]string{"group", "config", "shop", "--max-check-backoff", "-1m"}, "--max-check-backoff must be positive, not -1m0s"},
		{[]string{"group", "config", "shop", "--max-half-age", "0"}, "--max-half-age must be positive, not 0s"},
		{[]string{"group", "config", "shop", "--max-half-age", "forever"}, `invalid value "forever" for flag -max-half-age`},
		{[]string{"group", "config", "shop", "--check-backoff", "2m", "--max-check-backoff", "1m"}, "--check-backoff (2m0s) must not be above --max-check-backoff (1m0s)"},
		{[]string{"group", "config", "shop", "--max-checks", "0"}, "--max-checks must be between 1 and 4294967295, not 0"},
		{[]string{"group", "config", "shop", "--max-checks", "4294967296"}, "--max-checks must be between 1 and 4294967295, not 4294967296"},
		{[]string{"group", "config", "shop", "--max-checks", "-1"}, `invalid value "-1" for flag -max-checks`},
		// A valid setting does not excuse an invalid one.
		{[]string{"group", "config", "shop", "--max-checks", "3", "--expiry", "delete"}, `--expiry must be park or rollback, not "delete"`},
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

func TestCheckBackBrokerErrors(t *testing.T) {
	f := &fakeBroker{
		checkHalf: func(req *txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error) {
			if req.GetMessageId() == "m1" {
				return nil, status.Error(codes.FailedPrecondition, "half message m1 is COMMITTED, nothing to check")
			}
			return nil, status.Error(codes.NotFound, "half message nope not found")
		},
		listProducers: func(*txmqv1.ListProducersRequest) (*txmqv1.ListProducersResponse, error) {
			return nil, status.Error(codes.InvalidArgument, `bad producer group name "a b"`)
		},
		getConfig: func(*txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
			return nil, status.Error(codes.NotFound, "producer group nobody not found")
		},
		getConsumer: noConsumerGroup,
		setConfig: func(*txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
			return nil, status.Error(codes.FailedPrecondition, "check_backoff 2m0s is above max_check_backoff 1m0s")
		},
	}
	addr := f.start(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"half", "check", "m1"}, "brokerctl: FailedPrecondition: half message m1 is COMMITTED, nothing to check\n"},
		{[]string{"half", "check", "nope", "-o", "json"}, "brokerctl: NotFound: half message nope not found\n"},
		{[]string{"producer", "list", "--group", "a b"}, "brokerctl: InvalidArgument: bad producer group name \"a b\"\n"},
		{[]string{"group", "config", "nobody"}, "brokerctl: NotFound: consumer group nobody not found; producer group nobody not found\n"},
		{[]string{"group", "config", "shop", "--check-backoff", "2m", "-o", "json"}, "brokerctl: FailedPrecondition: check_backoff 2m0s is above max_check_backoff 1m0s\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", addr}, tc.args...)...)
		if r.code != exitFailure || r.stderr != tc.want || r.stdout != "" {
			t.Errorf("%q: exit code %d, stdout %q, stderr %q; want 1, nothing, %q", tc.args, r.code, r.stdout, r.stderr, tc.want)
		}
	}
}

func TestResolveHelpMentionsExpired(t *testing.T) {
	for _, cmd := range []string{"commit", "rollback"} {
		r := brokerctl(t, nil, "half", cmd, "-h")
		if r.code != exitOK || !strings.Contains(r.stderr, "usage: brokerctl half "+cmd+" MSG_ID") || !strings.Contains(r.stderr, "EXPIRED") {
			t.Errorf("half %s -h: exit code %d, stderr %q; want 0 and a usage that mentions EXPIRED", cmd, r.code, r.stderr)
		}
	}
	r := brokerctl(t, nil, "help")
	for _, want := range []string{"half check", "producer list", "group config", "works on EXPIRED messages too"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help does not mention %q:\n%s", want, r.stdout)
		}
	}
}
