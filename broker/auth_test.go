package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// testPrincipals: each principal's token is "<name>-secret".
var testPrincipals = []string{"order", "points", "audit", "billing", "ops", "nobody", "limited"}

const testRules = `
groups:
  operators: [ops]
rules:
  - who: [order]
    resources: [topic:orders, producer-group:shop]
    actions: [publish, transact]
    decision: allow
  - who: [points]
    resources: [topic:orders, consumer-group:points]
    actions: [subscribe]
    decision: allow
  - who: [audit]
    resources: [topic:orders, consumer-group:audit]
    actions: [subscribe]
    decision: allow
  - who: [billing]
    resources: [topic:bills, producer-group:billing]
    actions: [publish, transact]
    decision: allow
  - who: [group:operators]
    resources: ["*"]
    actions: [admin:read, admin:write]
    decision: allow
  - who: [ops]
    resources: [consumer-group:audit.*]
    actions: [admin:write]
    decision: deny
  - who: [limited]
    resources: [topic:*]
    actions: [publish]
    decision: allow
`

// writeAuthFile writes an auth file of the given principals (each with
// its token and, for limited, 2 requests/s) and rules.
func writeAuthFile(t *testing.T, path string, principals []string, rules string) {
	writeAuthFileLimits(t, path, principals, map[string]string{"limited": "requests_per_second: 2"}, rules)
}

// writeAuthFileLimits writes an auth file of the given principals, each
// with its token and its limits ("requests_per_second: 2") if it has
// some, and rules.
func writeAuthFileLimits(t *testing.T, path string, principals []string, limits map[string]string, rules string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("principals:\n")
	for _, name := range principals {
		h, err := bcrypt.GenerateFromPassword([]byte(name+"-secret"), bcrypt.MinCost)
		require.NoError(t, err)
		fmt.Fprintf(&b, "  - name: %s\n    token_hash: %q\n", name, h)
		if l, ok := limits[name]; ok {
			fmt.Fprintf(&b, "    limits: {%s}\n", l)
		}
	}
	b.WriteString(rules)
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
}

// startAuthBroker starts a broker with auth on and returns it and its
// auth file.
func startAuthBroker(t *testing.T) (*testBroker, string) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeAuthFile(t, path, testPrincipals, testRules)
	return startBroker(t, func(c *Config) { c.AuthFile = path }), path
}

// as is a context whose calls carry the principal's token.
func as(t *testing.T, who string) context.Context {
	return metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer "+who+"-secret")
}

func TestAuthTokenMissingWrongRevoked(t *testing.T) {
	tb, path := startAuthBroker(t)
	send := func(ctx context.Context) error {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")})
		return err
	}
	err := send(ctxT(t))
	require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
	require.ErrorContains(t, err, "credentials required")
	err = send(metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Bearer order-wrong"))
	require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
	err = send(metadata.AppendToOutgoingContext(ctxT(t), "authorization", "Basic b3JkZXI="))
	require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
	require.NoError(t, send(as(t, "order")))

	// A bad file keeps the rules in force.
	require.NoError(t, os.WriteFile(path, []byte("principals:\n  - name: order\n    token_hash: nope\n"), 0o600))
	require.ErrorContains(t, tb.ReloadAuth(), "line 2")
	require.NoError(t, send(as(t, "order")))

	// Revoked: the next call, on the same connection, is refused.
	writeAuthFile(t, path, []string{"points"}, "")
	require.NoError(t, tb.ReloadAuth())
	err = send(as(t, "order"))
	require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
	err = send(as(t, "points"))
	require.Equal(t, codes.PermissionDenied, codeOf(err), "%v", err)
}

// rpcCase calls one RPC; allowed is a principal the rules let call it,
// denied one whose rules do not cover it (nobody has no rule at all).
type rpcCase struct {
	method  string
	allowed string
	denied  string
	call    func(ctx context.Context, tb *testBroker) error
}

func rpcCases(halfID string) []rpcCase {
	adm := func(method string, f func(context.Context, txmqv1.AdminServiceClient) error) rpcCase {
		return rpcCase{method: adminMethod(method), allowed: "ops", denied: "order",
			call: func(ctx context.Context, tb *testBroker) error { return f(ctx, tb.admin) }}
	}
	ignore := func(_ any, err error) error { return err }
	return []rpcCase{
		{producerMethod("Send"), "order", "billing", func(ctx context.Context, tb *testBroker) error {
			return ignore(tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")}))
		}},
		{producerMethod("SendHalf"), "order", "billing", func(ctx context.Context, tb *testBroker) error {
			return ignore(tb.producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "t-" + strings.Repeat("1", 4), Body: []byte("x")}))
		}},
		// Ending billing's half message, by ID and by transaction.
		{producerMethod("EndTransaction"), "billing", "order", func(ctx context.Context, tb *testBroker) error {
			return ignore(end(tb, ctx, halfID, txmqv1.Resolution_RESOLUTION_ROLLBACK))
		}},
		{producerMethod("EndTransaction"), "billing", "order", func(ctx context.Context, tb *testBroker) error {
			return ignore(tb.producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{
				Target:     &txmqv1.EndTransactionRequest_Transaction{Transaction: &txmqv1.TransactionRef{ProducerGroup: "billing", TransactionId: "b-1"}},
				Resolution: txmqv1.Resolution_RESOLUTION_ROLLBACK}))
		}},
		{producerMethod("RegisterProducer"), "order", "billing", func(ctx context.Context, tb *testBroker) error {
			return ignore(tb.producer.RegisterProducer(ctx, &txmqv1.RegisterProducerRequest{ProducerGroup: "shop", InstanceId: "i1",
				Endpoint: &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "127.0.0.1:1"}}}))
		}},
		{producerMethod("Heartbeat"), "order", "billing", func(ctx context.Context, tb *testBroker) error {
			return ignore(tb.producer.Heartbeat(ctx, &txmqv1.HeartbeatRequest{ProducerGroup: "shop", InstanceId: "i1"}))
		}},
		{producerMethod("Session"), "order", "billing", func(ctx context.Context, tb *testBroker) error {
			return sessionCall(ctx, tb, &txmqv1.SessionRequest{Id: 1, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")}}})
		}},
		{"/txmq.v1.ConsumerService/Subscribe", "points", "order", func(ctx context.Context, tb *testBroker) error {
			return subscribeOnce(ctx, tb, "orders", "points")
		}},
		adm("ClusterStatus", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{}))
		}),
		adm("GetStats", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.GetStats(ctx, &txmqv1.GetStatsRequest{}))
		}),
		adm("JoinCluster", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.JoinCluster(ctx, &txmqv1.JoinClusterRequest{}))
		}),
		adm("RemoveNode", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.RemoveNode(ctx, &txmqv1.RemoveNodeRequest{NodeId: "nope"}))
		}),
		adm("TransferLeadership", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.TransferLeadership(ctx, &txmqv1.TransferLeadershipRequest{NodeId: "nope"}))
		}),
		adm("TakeSnapshot", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.TakeSnapshot(ctx, &txmqv1.TakeSnapshotRequest{}))
		}),
		adm("Clock", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.Clock(ctx, &txmqv1.ClockRequest{}))
		}),
		adm("CreateTopic", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.CreateTopic(ctx, &txmqv1.CreateTopicRequest{Name: "created"}))
		}),
		adm("DeleteTopic", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "nope"}))
		}),
		adm("ListTopics", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ListTopics(ctx, &txmqv1.ListTopicsRequest{}))
		}),
		adm("GetMessage", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.GetMessage(ctx, &txmqv1.GetMessageRequest{Topic: "orders", Sequence: 1}))
		}),
		adm("FindMessages", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.FindMessages(ctx, &txmqv1.FindMessagesRequest{Key: "k"}))
		}),
		adm("ReadMessages", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "orders"}))
		}),
		adm("ListHalfMessages", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{}))
		}),
		adm("GetHalfMessage", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: halfID}))
		}),
		adm("ResolveHalfMessage", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ResolveHalfMessage(ctx, &txmqv1.ResolveHalfMessageRequest{MessageId: halfID, Resolution: txmqv1.Resolution_RESOLUTION_ROLLBACK}))
		}),
		adm("CheckHalfMessage", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.CheckHalfMessage(ctx, &txmqv1.CheckHalfMessageRequest{MessageId: halfID}))
		}),
		adm("ListProducers", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ListProducers(ctx, &txmqv1.ListProducersRequest{}))
		}),
		adm("GetProducerGroupConfig", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.GetProducerGroupConfig(ctx, &txmqv1.GetProducerGroupConfigRequest{ProducerGroup: "billing"}))
		}),
		adm("SetProducerGroupConfig", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			maxChecks := uint32(3)
			return ignore(c.SetProducerGroupConfig(ctx, &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "billing", MaxChecks: &maxChecks}}))
		}),
		adm("DescribeConsumerGroup", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"}))
		}),
		adm("ListConsumerGroups", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ListConsumerGroups(ctx, &txmqv1.ListConsumerGroupsRequest{}))
		}),
		adm("CreateConsumerGroup", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "made", Topic: "orders"}))
		}),
		adm("DeleteConsumerGroup", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.DeleteConsumerGroup(ctx, &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: "made", Topic: "orders"}))
		}),
		adm("GetConsumerGroupConfig", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.GetConsumerGroupConfig(ctx, &txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "points"}))
		}),
		adm("SetConsumerGroupConfig", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{ConsumerGroup: "points", AckDeadline: durationpb.New(42e9)}}))
		}),
		adm("ResetConsumerGroup", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ResetConsumerGroup(ctx, &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: "points", Topic: "orders", To: txmqv1.StartPosition_START_POSITION_EARLIEST}))
		}),
		adm("ListDeadLetters", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.ListDeadLetters(ctx, &txmqv1.ListDeadLettersRequest{ConsumerGroup: "points"}))
		}),
		adm("GetDeadLetter", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.GetDeadLetter(ctx, &txmqv1.GetDeadLetterRequest{ConsumerGroup: "points", MessageId: unknownID}))
		}),
		adm("RedriveDeadLetters", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.RedriveDeadLetters(ctx, &txmqv1.RedriveDeadLettersRequest{ConsumerGroup: "points", All: true}))
		}),
		adm("PurgeDeadLetters", func(ctx context.Context, c txmqv1.AdminServiceClient) error {
			return ignore(c.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "points", All: true}))
		}),
	}
}

// sessionCall sends one request on a new producer session and returns
// the stream's or the request's error.
func sessionCall(ctx context.Context, tb *testBroker, req *txmqv1.SessionRequest) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := tb.producer.Session(ctx)
	if err != nil {
		return err
	}
	// A stream the broker has already ended says why on Recv.
	if err := s.Send(req); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	resp, err := s.Recv()
	if err != nil {
		return err
	}
	if e := resp.GetError(); e != nil {
		return status.Error(codes.Code(e.Code), e.Message)
	}
	return nil
}

// subscribeOnce subscribes and returns the stream's first answer's error.
func subscribeOnce(ctx context.Context, tb *testBroker, topic, group string) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := tb.consumer.Subscribe(ctx)
	if err != nil {
		return err
	}
	// A stream the broker has already ended says why on Recv.
	if err := s.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{Topic: topic, ConsumerGroup: group}}}); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	_, err = s.Recv()
	return err
}

// TestAuthEveryRPC calls every RPC as a principal whose rules do not
// cover it and as one with no rule (PermissionDenied, and nothing in the
// store changes), then as one allowed (anything but Unauthenticated or
// PermissionDenied). Every method of the three services is in the table.
func TestAuthEveryRPC(t *testing.T) {
	tb, _ := startAuthBroker(t)
	_, err := tb.producer.SendHalf(as(t, "billing"), &txmqv1.SendHalfRequest{Topic: "bills", ProducerGroup: "billing", TransactionId: "b-1", Body: []byte("x")})
	require.NoError(t, err)
	r, err := tb.producer.SendHalf(as(t, "billing"), &txmqv1.SendHalfRequest{Topic: "bills", ProducerGroup: "billing", TransactionId: "b-2", Body: []byte("x")})
	require.NoError(t, err)
	cases := rpcCases(r.MessageId)

	covered := map[string]bool{}
	for _, c := range cases {
		covered[c.method] = true
	}
	for _, sd := range []struct {
		name    string
		methods []string
	}{
		{txmqv1.ProducerService_ServiceDesc.ServiceName, methodNames(txmqv1.ProducerService_ServiceDesc.Methods, txmqv1.ProducerService_ServiceDesc.Streams)},
		{txmqv1.ConsumerService_ServiceDesc.ServiceName, methodNames(txmqv1.ConsumerService_ServiceDesc.Methods, txmqv1.ConsumerService_ServiceDesc.Streams)},
		{txmqv1.AdminService_ServiceDesc.ServiceName, methodNames(txmqv1.AdminService_ServiceDesc.Methods, txmqv1.AdminService_ServiceDesc.Streams)},
	} {
		for _, m := range sd.methods {
			full := "/" + sd.name + "/" + m
			require.Contains(t, methodNeeds, full, "%s is not in the table of methodNeeds", full)
			require.True(t, covered[full], "%s has no case in this test", full)
		}
	}

	before := txmqtest.StoreContent(t, tb.Node())
	for _, c := range cases {
		for _, who := range []string{c.denied, "nobody"} {
			err := c.call(as(t, who), tb)
			require.Equal(t, codes.PermissionDenied, codeOf(err), "%s as %s: %v", c.method, who, err)
			require.ErrorContains(t, err, fmt.Sprintf("principal %q may not", who))
		}
	}
	require.Equal(t, before, txmqtest.StoreContent(t, tb.Node()), "refused calls changed the store")

	for _, c := range cases {
		err := c.call(as(t, c.allowed), tb)
		require.NotContains(t, []codes.Code{codes.PermissionDenied, codes.Unauthenticated, codes.Internal}, codeOf(err), "%s as %s: %v", c.method, c.allowed, err)
	}
}

func methodNames(unary []grpc.MethodDesc, streams []grpc.StreamDesc) []string {
	var names []string
	for _, m := range unary {
		names = append(names, m.MethodName)
	}
	for _, s := range streams {
		names = append(names, s.StreamName)
	}
	return names
}

// TestAuthAckOnlyOwnGroup: a consumer's acks settle its own group's
// deliveries only. audit acks a message delivered to points (and never
// to audit): points' progress does not move, and points still settles it.
func TestAuthAckOnlyOwnGroup(t *testing.T) {
	tb, _ := startAuthBroker(t)
	points := subscribeWith(t, as(t, "points"), tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "points"})
	audit := subscribeWith(t, as(t, "audit"), tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "audit", StartPosition: txmqv1.StartPosition_START_POSITION_LATEST})
	_, err := tb.producer.Send(as(t, "order"), &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")})
	require.NoError(t, err)
	d := points.next(10 * time.Second)
	require.NotNil(t, d)

	audit.ack(d.MessageId)
	_, err = tb.producer.Send(as(t, "order"), &txmqv1.SendRequest{Topic: "orders", Body: []byte("y")})
	require.NoError(t, err)
	// audit sees the second message (its own), and acks it: once that is
	// confirmed, the ack of the first has been handled too.
	d2 := audit.next(10 * time.Second)
	require.NotNil(t, d2)
	audit.ack(d2.MessageId)
	audit.waitConfirm(d2.MessageId)
	desc, err := tb.admin.DescribeConsumerGroup(as(t, "ops"), &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "points"})
	require.NoError(t, err)
	for _, p := range desc.Topics {
		require.Less(t, p.AckedThrough, d.Sequence, "audit's ack moved points' position")
		require.Zero(t, p.AckedAbove, "audit's ack settled points' delivery")
	}
	points.ack(d.MessageId)
	points.waitConfirm(d.MessageId)
}

// TestAuthRateLimitPerPrincipal: limited (2 requests/s) is refused with
// ResourceExhausted and when to retry; order is not.
func TestAuthRateLimitPerPrincipal(t *testing.T) {
	tb, _ := startAuthBroker(t)
	send := func(who string) error {
		_, err := tb.producer.Send(as(t, who), &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")})
		return err
	}
	var err error
	for i := 0; i < 5 && err == nil; i++ {
		err = send("limited")
	}
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	require.ErrorContains(t, err, `principal "limited" is over its limit of 2 requests/s; retry in`)
	for range 20 {
		require.NoError(t, send("order"))
	}
}

func TestAuthFileErrorsNameTheLine(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"principals:\n  - name: a\n", `line 2: principal "a": needs a token_hash`},
		{"principals:\n  - name: a\n    token_hash: x\n", `line 2: principal "a": token_hash is not a bcrypt hash`},
		{"principals:\n  - name: a\n    certs: [a]\n  - name: a\n    certs: [b]\n", `line 4: principal "a": defined twice`},
		{"rules:\n  - who: [x]\n    resources: [topic:a]\n    actions: [publish]\n    decision: allow\n", `line 2: rule: no principal "x"`},
		{"principals:\n  - name: a\n    certs: [a]\nrules:\n  - who: [a]\n    resources: [queue:a]\n    actions: [publish]\n    decision: allow\n", `line 5: rule: resource "queue:a"`},
		{"principals:\n  - name: a\n    certs: [a]\nrules:\n  - who: [a]\n    resources: [topic:a]\n    actions: [send]\n    decision: allow\n", `line 5: rule: action "send"`},
		{"principals:\n  - name: a\n    certs: [a]\nrules:\n  - who: [a]\n    resources: [topic:a*b]\n    actions: [publish]\n    decision: maybe\n", `line 5: rule: decision "maybe"`},
		{"groups:\n  ops: [ghost]\n", `line 2: group "ops": no principal "ghost"`},
		{"principal:\n  - name: a\n", "field principal not found"},
	} {
		_, err := parsePolicy([]byte(c.file))
		require.ErrorContains(t, err, c.want, "%s", c.file)
	}
}

func TestAuthResourcePatterns(t *testing.T) {
	p, err := parsePolicy([]byte(`
principals:
  - {name: a, certs: [a]}
rules:
  - {who: ["*"], resources: ["topic:orders.*", "consumer-group:points"], actions: [subscribe], decision: allow}
  - {who: [a], resources: ["topic:orders.secret"], actions: ["*"], decision: deny}
  - {who: [a], resources: [cluster], actions: [admin:read], decision: allow}
`))
	require.NoError(t, err)
	a := p.principals["a"]
	for _, c := range []struct {
		action, typ, name string
		want              bool
	}{
		{actSubscribe, "topic", "orders.eu", true},
		{actSubscribe, "topic", "orders", false},
		{actSubscribe, "topic", "orders.secret", false},
		{actSubscribe, "topic", "*", false},
		{actPublish, "topic", "orders.eu", false},
		{actSubscribe, "consumer-group", "points", true},
		{actSubscribe, "consumer-group", "points2", false},
		{actAdminRead, resCluster, "", true},
		{actAdminWrite, resCluster, "", false},
	} {
		require.Equal(t, c.want, p.decide(a, c.action, c.typ, c.name), "%+v", c)
	}
}

// TestAuthInstancesPerGroup: a producer group's registered instances are
// bounded; one registering again is let in.
func TestAuthInstancesPerGroup(t *testing.T) {
	tb := startBroker(t, func(c *Config) { c.Limits.Instances = 2 })
	reg := func(id string) error {
		_, err := tb.producer.RegisterProducer(ctxT(t), &txmqv1.RegisterProducerRequest{ProducerGroup: "shop", InstanceId: id,
			Endpoint: &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: "127.0.0.1:1"}}})
		return err
	}
	require.NoError(t, reg("a"))
	require.NoError(t, reg("b"))
	require.NoError(t, reg("a"))
	err := reg("c")
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	require.ErrorContains(t, err, `producer group "shop" has 2 instances registered, its limit`)
}

// TestCallbackAllowlist: a producer group's static callback and a
// registered endpoint are refused when the guard does not allow them.
func TestCallbackAllowlist(t *testing.T) {
	tb := startBroker(t, nil)
	for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://10.1.2.3/check", "http://evil.example/check"} {
		_, err := tb.admin.SetProducerGroupConfig(ctxT(t), &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", CallbackUrl: &u}})
		require.Equal(t, codes.InvalidArgument, codeOf(err), "%s: %v", u, err)
		require.ErrorContains(t, err, "not allowed")
	}
	for _, addr := range []string{"169.254.169.254:80", "10.1.2.3:9000"} {
		_, err := tb.producer.RegisterProducer(ctxT(t), &txmqv1.RegisterProducerRequest{ProducerGroup: "shop", InstanceId: "i",
			Endpoint: &txmqv1.CallbackEndpoint{Kind: &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: addr}}})
		require.Equal(t, codes.InvalidArgument, codeOf(err), "%s: %v", addr, err)
	}
	g, err := tb.admin.ListProducers(ctxT(t), &txmqv1.ListProducersRequest{ProducerGroup: "shop"})
	require.NoError(t, err)
	require.Empty(t, g.Instances)
}

// TestClusterAuthPeerToken: with auth on every node, nodes join with
// their peer token, and ClusterStatus gathers every member's view.
func TestClusterAuthPeerToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeAuthFile(t, path, []string{"node", "ops"}, `
rules:
  - {who: [node], resources: [cluster], actions: [admin:read, admin:write], decision: allow}
  - {who: [ops], resources: ["*"], actions: [admin:read], decision: allow}
`)
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.AuthFile = path
		cfg.PeerToken = "node-secret"
	})
	c.WaitMembers(3)
	tb := c.Leader()
	txmqtest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		st, err := tb.admin.ClusterStatus(as(t, "ops"), &txmqv1.ClusterStatusRequest{})
		if err != nil {
			return err
		}
		for _, m := range st.Nodes {
			if !m.Reachable || m.AppliedIndex == 0 {
				return fmt.Errorf("no view of %s yet", m.Id)
			}
		}
		return nil
	})
	c.VerifyStores()
}

// TestCallbackRedirectNotDelivered: a producer group's static callback
// that redirects (to the metadata address) is not followed, and the check
// counts as not delivered: no attempt is used up.
func TestCallbackRedirectNotDelivered(t *testing.T) {
	srv := httptest.NewServer(http.RedirectHandler("http://169.254.169.254/latest/meta-data/", http.StatusFound))
	defer srv.Close()
	tb := startBroker(t, nil)
	id := sendHalf(t, tb, "orders", "shop", "tx-1", "x")
	_, err := tb.admin.SetProducerGroupConfig(ctxT(t), &txmqv1.SetProducerGroupConfigRequest{Config: &txmqv1.ProducerGroupConfig{ProducerGroup: "shop", CallbackUrl: &srv.URL}})
	require.NoError(t, err)
	r, err := tb.admin.CheckHalfMessage(ctxT(t), &txmqv1.CheckHalfMessageRequest{MessageId: id})
	require.NoError(t, err)
	require.Contains(t, r.Error, "not followed")
	require.Equal(t, txmqv1.Resolution_RESOLUTION_UNSPECIFIED, r.Answer)
	h, err := tb.admin.GetHalfMessage(ctxT(t), &txmqv1.GetHalfMessageRequest{MessageId: id})
	require.NoError(t, err)
	require.Zero(t, h.Message.CheckAttempts, "a check that was not delivered used up an attempt")
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.Message.State)
}

// TestAuthStreamsPerPrincipal: a principal at its limit of open streams
// cannot open another until one ends; another principal can.
func TestAuthStreamsPerPrincipal(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeAuthFile(t, path, testPrincipals, testRules)
	tb := startBroker(t, func(c *Config) {
		c.AuthFile = path
		c.Limits.Streams = 1
	})
	first := subscribeWith(t, as(t, "points"), tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "points"})
	err := subscribeOnce(as(t, "points"), tb, "orders", "points")
	require.Equal(t, codes.ResourceExhausted, codeOf(err), "%v", err)
	require.ErrorContains(t, err, `principal "points" has 1 streams open, its limit`)
	require.NoError(t, subscribeOnce(as(t, "audit"), tb, "orders", "audit"))
	first.cancel()
	txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
		return subscribeOnce(as(t, "points"), tb, "orders", "points")
	})
}

// TestAuthReloadReachesOpenStreams: a principal removed by a reload is
// refused on the next request of a stream it opened before.
func TestAuthReloadReachesOpenStreams(t *testing.T) {
	tb, path := startAuthBroker(t)
	ctx, cancel := context.WithCancel(as(t, "order"))
	defer cancel()
	s, err := tb.producer.Session(ctx)
	require.NoError(t, err)
	send := func(id uint64) error {
		if err := s.Send(&txmqv1.SessionRequest{Id: id, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")}}}); err != nil {
			return err
		}
		_, err := s.Recv()
		return err
	}
	require.NoError(t, send(1))
	writeAuthFile(t, path, []string{"points"}, "")
	require.NoError(t, tb.ReloadAuth())
	err = send(2)
	require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
}

// FuzzParsePolicy: any auth file loads or is refused with an error, and a
// loaded one answers every question.
func FuzzParsePolicy(f *testing.F) {
	f.Add([]byte(testRules))
	f.Add([]byte("principals:\n  - {name: a, certs: [a]}\nrules:\n  - {who: [a], resources: [\"topic:o.*\", cluster], actions: [\"*\"], decision: deny}\n"))
	f.Add([]byte("groups: [x]\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		p, err := parsePolicy(raw)
		if err != nil {
			return
		}
		for _, pr := range p.principals {
			for _, a := range knownActions {
				p.decide(pr, a, "topic", "orders")
				p.decide(pr, a, resCluster, "")
			}
		}
	})
}
