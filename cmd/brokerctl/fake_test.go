package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The real cluster of broker_test.go runs hashicorp/raft, which
		// leaves these to end on their own after Shutdown.
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"),
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*Raft).runSnapshots"),
		goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"),
		goleak.IgnoreAnyFunction("github.com/txmq/txmq/raftlog.waitApplied"),
	)
}

// fakeBroker is a test double of the broker's gRPC services: each RPC records
// its request and answers with its script; an RPC without a script answers
// Unimplemented. After follow, it is a follower: every RPC records its
// request and answers Unavailable with a NotLeader detail.
type fakeBroker struct {
	txmqv1.UnimplementedProducerServiceServer
	txmqv1.UnimplementedConsumerServiceServer
	txmqv1.UnimplementedAdminServiceServer

	send          func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error)
	sendHalf      func(*txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error)
	listHalf      func(*txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error)
	getHalf       func(*txmqv1.GetHalfMessageRequest) (*txmqv1.GetHalfMessageResponse, error)
	resolveHalf   func(*txmqv1.ResolveHalfMessageRequest) (*txmqv1.ResolveHalfMessageResponse, error)
	createTopic   func(*txmqv1.CreateTopicRequest) (*txmqv1.CreateTopicResponse, error)
	listTopics    func(*txmqv1.ListTopicsRequest) (*txmqv1.ListTopicsResponse, error)
	describeGroup func(*txmqv1.DescribeConsumerGroupRequest) (*txmqv1.DescribeConsumerGroupResponse, error)
	listGroups    func(*txmqv1.ListConsumerGroupsRequest) (*txmqv1.ListConsumerGroupsResponse, error)
	getConsumer   func(*txmqv1.GetConsumerGroupConfigRequest) (*txmqv1.GetConsumerGroupConfigResponse, error)
	setConsumer   func(*txmqv1.SetConsumerGroupConfigRequest) (*txmqv1.SetConsumerGroupConfigResponse, error)
	resetGroup    func(*txmqv1.ResetConsumerGroupRequest) (*txmqv1.ResetConsumerGroupResponse, error)
	listDLQ       func(*txmqv1.ListDeadLettersRequest) (*txmqv1.ListDeadLettersResponse, error)
	getDLQ        func(*txmqv1.GetDeadLetterRequest) (*txmqv1.GetDeadLetterResponse, error)
	redrive       func(*txmqv1.RedriveDeadLettersRequest) (*txmqv1.RedriveDeadLettersResponse, error)
	purge         func(*txmqv1.PurgeDeadLettersRequest) (*txmqv1.PurgeDeadLettersResponse, error)
	clusterStatus func(*txmqv1.ClusterStatusRequest) (*txmqv1.ClusterStatusResponse, error)
	checkHalf     func(*txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error)
	listProducers func(*txmqv1.ListProducersRequest) (*txmqv1.ListProducersResponse, error)
	getConfig     func(*txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error)
	setConfig     func(*txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error)
	joinCluster   func(*txmqv1.JoinClusterRequest) (*txmqv1.JoinClusterResponse, error)
	removeNode    func(*txmqv1.RemoveNodeRequest) (*txmqv1.RemoveNodeResponse, error)
	transfer      func(*txmqv1.TransferLeadershipRequest) (*txmqv1.TransferLeadershipResponse, error)
	snapshot      func(*txmqv1.TakeSnapshotRequest) (*txmqv1.TakeSnapshotResponse, error)
	stats         func(*txmqv1.GetStatsRequest) (*txmqv1.GetStatsResponse, error)
	subscribe     func(grpc.BidiStreamingServer[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]) error

	mu       sync.Mutex
	requests []proto.Message
	// leader is what a follower names in its NotLeader answers.
	leader *txmqv1.NotLeader
}

// notLeaderError is the Unavailable status of a follower that names the
// leader at address (none when empty).
func notLeaderError(msg, address string) error {
	id := ""
	if address != "" {
		id = "leader@" + address
	}
	st, err := status.New(codes.Unavailable, msg).WithDetails(&txmqv1.NotLeader{LeaderId: id, LeaderAddress: address})
	if err != nil {
		panic(err)
	}
	return st.Err()
}

// follow makes f a follower of the leader at address: from now on every RPC
// answers Unavailable with a NotLeader detail naming it (none when empty).
func (f *fakeBroker) follow(address string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leader = &txmqv1.NotLeader{LeaderAddress: address}
}

// refusal is the answer of a follower, nil for a leader.
func (f *fakeBroker) refusal() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.leader == nil {
		return nil
	}
	return notLeaderError("not the leader", f.leader.GetLeaderAddress())
}

func (f *fakeBroker) record(req proto.Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests = append(f.requests, req)
}

func (f *fakeBroker) recorded() []proto.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]proto.Message(nil), f.requests...)
}

func answer[Req proto.Message, Resp any](f *fakeBroker, req Req, script func(Req) (Resp, error)) (Resp, error) {
	f.record(req)
	if err := f.refusal(); err != nil {
		var none Resp
		return none, err
	}
	if script == nil {
		var none Resp
		return none, status.Error(codes.Unimplemented, "not scripted")
	}
	return script(req)
}

func (f *fakeBroker) Send(_ context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
	return answer(f, req, f.send)
}

func (f *fakeBroker) SendHalf(_ context.Context, req *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
	return answer(f, req, f.sendHalf)
}

func (f *fakeBroker) ListHalfMessages(_ context.Context, req *txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
	return answer(f, req, f.listHalf)
}

func (f *fakeBroker) GetHalfMessage(_ context.Context, req *txmqv1.GetHalfMessageRequest) (*txmqv1.GetHalfMessageResponse, error) {
	return answer(f, req, f.getHalf)
}

func (f *fakeBroker) ResolveHalfMessage(_ context.Context, req *txmqv1.ResolveHalfMessageRequest) (*txmqv1.ResolveHalfMessageResponse, error) {
	return answer(f, req, f.resolveHalf)
}

func (f *fakeBroker) CreateTopic(_ context.Context, req *txmqv1.CreateTopicRequest) (*txmqv1.CreateTopicResponse, error) {
	return answer(f, req, f.createTopic)
}

func (f *fakeBroker) ListTopics(_ context.Context, req *txmqv1.ListTopicsRequest) (*txmqv1.ListTopicsResponse, error) {
	return answer(f, req, f.listTopics)
}

func (f *fakeBroker) DescribeConsumerGroup(_ context.Context, req *txmqv1.DescribeConsumerGroupRequest) (*txmqv1.DescribeConsumerGroupResponse, error) {
	return answer(f, req, f.describeGroup)
}

func (f *fakeBroker) ListConsumerGroups(_ context.Context, req *txmqv1.ListConsumerGroupsRequest) (*txmqv1.ListConsumerGroupsResponse, error) {
	return answer(f, req, f.listGroups)
}

func (f *fakeBroker) GetConsumerGroupConfig(_ context.Context, req *txmqv1.GetConsumerGroupConfigRequest) (*txmqv1.GetConsumerGroupConfigResponse, error) {
	return answer(f, req, f.getConsumer)
}

func (f *fakeBroker) SetConsumerGroupConfig(_ context.Context, req *txmqv1.SetConsumerGroupConfigRequest) (*txmqv1.SetConsumerGroupConfigResponse, error) {
	return answer(f, req, f.setConsumer)
}

func (f *fakeBroker) ResetConsumerGroup(_ context.Context, req *txmqv1.ResetConsumerGroupRequest) (*txmqv1.ResetConsumerGroupResponse, error) {
	return answer(f, req, f.resetGroup)
}

func (f *fakeBroker) ListDeadLetters(_ context.Context, req *txmqv1.ListDeadLettersRequest) (*txmqv1.ListDeadLettersResponse, error) {
	return answer(f, req, f.listDLQ)
}

func (f *fakeBroker) GetDeadLetter(_ context.Context, req *txmqv1.GetDeadLetterRequest) (*txmqv1.GetDeadLetterResponse, error) {
	return answer(f, req, f.getDLQ)
}

func (f *fakeBroker) RedriveDeadLetters(_ context.Context, req *txmqv1.RedriveDeadLettersRequest) (*txmqv1.RedriveDeadLettersResponse, error) {
	return answer(f, req, f.redrive)
}

func (f *fakeBroker) PurgeDeadLetters(_ context.Context, req *txmqv1.PurgeDeadLettersRequest) (*txmqv1.PurgeDeadLettersResponse, error) {
	return answer(f, req, f.purge)
}

func (f *fakeBroker) ClusterStatus(_ context.Context, req *txmqv1.ClusterStatusRequest) (*txmqv1.ClusterStatusResponse, error) {
	return answer(f, req, f.clusterStatus)
}

func (f *fakeBroker) CheckHalfMessage(_ context.Context, req *txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error) {
	return answer(f, req, f.checkHalf)
}

func (f *fakeBroker) ListProducers(_ context.Context, req *txmqv1.ListProducersRequest) (*txmqv1.ListProducersResponse, error) {
	return answer(f, req, f.listProducers)
}

func (f *fakeBroker) GetProducerGroupConfig(_ context.Context, req *txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
	return answer(f, req, f.getConfig)
}

func (f *fakeBroker) SetProducerGroupConfig(_ context.Context, req *txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
	return answer(f, req, f.setConfig)
}

func (f *fakeBroker) JoinCluster(_ context.Context, req *txmqv1.JoinClusterRequest) (*txmqv1.JoinClusterResponse, error) {
	return answer(f, req, f.joinCluster)
}

func (f *fakeBroker) RemoveNode(_ context.Context, req *txmqv1.RemoveNodeRequest) (*txmqv1.RemoveNodeResponse, error) {
	return answer(f, req, f.removeNode)
}

func (f *fakeBroker) TransferLeadership(_ context.Context, req *txmqv1.TransferLeadershipRequest) (*txmqv1.TransferLeadershipResponse, error) {
	return answer(f, req, f.transfer)
}

func (f *fakeBroker) TakeSnapshot(_ context.Context, req *txmqv1.TakeSnapshotRequest) (*txmqv1.TakeSnapshotResponse, error) {
	return answer(f, req, f.snapshot)
}

func (f *fakeBroker) GetStats(_ context.Context, req *txmqv1.GetStatsRequest) (*txmqv1.GetStatsResponse, error) {
	return answer(f, req, f.stats)
}

func (f *fakeBroker) Subscribe(stream grpc.BidiStreamingServer[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]) error {
	if err := f.refusal(); err != nil {
		// A follower refuses the subscription once it has read it.
		start, rerr := stream.Recv()
		if rerr != nil {
			return rerr
		}
		f.record(start)
		return err
	}
	if f.subscribe == nil {
		return status.Error(codes.Unimplemented, "not scripted")
	}
	return f.subscribe(stream)
}

// serveDeliveries scripts Subscribe: it records the start, answers
// Subscribed, pushes the deliveries, then records every request (acks,
// nacks, extensions) and confirms every ack unless confirm is false. When
// brokerctl closes its side of the stream, it ends the stream, as the broker
// does.
func (f *fakeBroker) serveDeliveries(confirm bool, deliveries ...*txmqv1.Delivery) {
	f.subscribe = func(stream grpc.BidiStreamingServer[txmqv1.SubscribeRequest, txmqv1.SubscribeResponse]) error {
		start, err := stream.Recv()
		if err != nil {
			return err
		}
		f.record(start)
		err = stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{
			Topic:         start.GetStart().GetTopic(),
			ConsumerGroup: start.GetStart().GetConsumerGroup(),
		}}})
		if err != nil {
			return err
		}
		for _, d := range deliveries {
			if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: d}}); err != nil {
				return err
			}
		}
		for {
			req, err := stream.Recv()
			if err != nil {
				return nil // brokerctl went away
			}
			f.record(req)
			if !confirm || req.GetAck() == nil {
				continue
			}
			err = stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_AckConfirm{AckConfirm: &txmqv1.AckConfirm{
				MessageIds: req.GetAck().GetMessageIds(),
			}}})
			if err != nil {
				return err
			}
		}
	}
}

// start serves f on 127.0.0.1:0 until the test ends and returns its address.
func (f *fakeBroker) start(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	txmqv1.RegisterProducerServiceServer(srv, f)
	txmqv1.RegisterConsumerServiceServer(srv, f)
	txmqv1.RegisterAdminServiceServer(srv, f)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	return lis.Addr().String()
}

// deadAddress returns an address where nothing listens: connecting to it is
// refused at once.
func deadAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

type result struct {
	code   int
	stdout string
	stderr string
}

// brokerctl runs the command line with env as its environment, bounded by
// a deadline so that a hanging command fails the test instead of blocking.
func brokerctl(t *testing.T, env map[string]string, args ...string) result {
	t.Helper()
	return brokerctlStdin(t, "", env, args...)
}

// brokerctlStdin is brokerctl with stdin reading from the string stdin.
func brokerctlStdin(t *testing.T, stdin string, env map[string]string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := run(ctx, args, func(k string) string { return env[k] }, strings.NewReader(stdin), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// wantOK fails the test unless r is a success.
func wantOK(t *testing.T, r result) {
	t.Helper()
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("exit code %d, stderr %q; want 0 and nothing", r.code, r.stderr)
	}
}

// wantRequests compares the requests f received with want, in order.
func wantRequests(t *testing.T, f *fakeBroker, want ...proto.Message) {
	t.Helper()
	got := f.recorded()
	if len(got) != len(want) {
		t.Fatalf("broker got %d request(s), want %d: %v", len(got), len(want), got)
	}
	for i := range want {
		if !proto.Equal(got[i], want[i]) {
			t.Errorf("request %d:\n got %s\nwant %s", i, prototext.Format(got[i]), prototext.Format(want[i]))
		}
	}
}
