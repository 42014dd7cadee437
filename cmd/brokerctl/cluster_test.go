package main

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// clusterLeader is a leader fake that answers the cluster commands.
func clusterLeader() *fakeBroker {
	return &fakeBroker{
		joinCluster: func(req *txmqv1.JoinClusterRequest) (*txmqv1.JoinClusterResponse, error) {
			return &txmqv1.JoinClusterResponse{Added: req.GetNodeId() == "n3"}, nil
		},
		removeNode: func(req *txmqv1.RemoveNodeRequest) (*txmqv1.RemoveNodeResponse, error) {
			if req.GetNodeId() == "n9" {
				return nil, status.Error(codes.NotFound, "node n9 is not a member")
			}
			return &txmqv1.RemoveNodeResponse{}, nil
		},
		transfer: func(req *txmqv1.TransferLeadershipRequest) (*txmqv1.TransferLeadershipResponse, error) {
			if req.GetNodeId() == "" {
				return &txmqv1.TransferLeadershipResponse{LeaderId: "n3"}, nil
			}
			return &txmqv1.TransferLeadershipResponse{LeaderId: req.GetNodeId()}, nil
		},
		snapshot: func(*txmqv1.TakeSnapshotRequest) (*txmqv1.TakeSnapshotResponse, error) {
			return &txmqv1.TakeSnapshotResponse{Index: 42}, nil
		},
	}
}

func TestClusterJoin(t *testing.T) {
	leader := clusterLeader()
	leaderAddr := leader.start(t)
	follower := &fakeBroker{}
	followerAddr := follower.start(t)
	follower.follow(leaderAddr)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "join", "n3", "10.0.0.3:7421", "--grpc", "10.0.0.3:7420"}, "node n3 added\n"},
		{[]string{"cluster", "join", "n2", "10.0.0.2:7421"}, "node n2 already a member\n"},
		{[]string{"-o", "json", "cluster", "join", "--grpc=10.0.0.3:7420", "n3", "10.0.0.3:7421"}, `{"node_id":"n3","added":true}` + "\n"},
		{[]string{"cluster", "join", "n2", "10.0.0.2:7421", "-o", "json"}, `{"node_id":"n2","added":false}` + "\n"},
	} {
		// Sent to the follower, the join lands on the leader.
		r := brokerctl(t, nil, append([]string{"--addr", followerAddr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed %q, want %q", tc.args, r.stdout, tc.want)
		}
	}
	n3 := &txmqv1.JoinClusterRequest{NodeId: "n3", RaftAddress: "10.0.0.3:7421", GrpcAddress: "10.0.0.3:7420"}
	n2 := &txmqv1.JoinClusterRequest{NodeId: "n2", RaftAddress: "10.0.0.2:7421"}
	wantRequests(t, leader, n3, n2, n3, n2)
	wantRequests(t, follower, n3, n2, n3, n2)
}

func TestClusterRemove(t *testing.T) {
	leader := clusterLeader()
	addr := leader.start(t)

	r := brokerctl(t, nil, "--addr", addr, "cluster", "remove", "n2", "-f")
	wantOK(t, r)
	if r.stdout != "node n2 removed\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	r = brokerctl(t, nil, "--addr", addr, "-o", "json", "cluster", "remove", "n3", "-f")
	wantOK(t, r)
	if want := `{"node_id":"n3"}` + "\n"; r.stdout != want {
		t.Errorf("json %q, want %q", r.stdout, want)
	}
	r = brokerctl(t, nil, "--addr", addr, "cluster", "remove", "n9", "-f")
	if r.code != exitFailure || r.stderr != "brokerctl: NotFound: node n9 is not a member\n" || r.stdout != "" {
		t.Errorf("exit code %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	wantRequests(t, leader,
		&txmqv1.RemoveNodeRequest{NodeId: "n2"},
		&txmqv1.RemoveNodeRequest{NodeId: "n3"},
		&txmqv1.RemoveNodeRequest{NodeId: "n9"})
}

func TestClusterTransferLeader(t *testing.T) {
	leader := clusterLeader()
	leaderAddr := leader.start(t)
	follower := &fakeBroker{}
	followerAddr := follower.start(t)
	follower.follow(leaderAddr)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cluster", "transfer-leader"}, "leader is now n3\n"},
		{[]string{"cluster", "transfer-leader", "n2"}, "leader is now n2\n"},
		{[]string{"cluster", "transfer-leader", "n2", "-o", "json"}, `{"leader_id":"n2"}` + "\n"},
	} {
		r := brokerctl(t, nil, append([]string{"--addr", followerAddr}, tc.args...)...)
		wantOK(t, r)
		if r.stdout != tc.want {
			t.Errorf("%q printed %q, want %q", tc.args, r.stdout, tc.want)
		}
	}
	want := []proto.Message{
		&txmqv1.TransferLeadershipRequest{},
		&txmqv1.TransferLeadershipRequest{NodeId: "n2"},
		&txmqv1.TransferLeadershipRequest{NodeId: "n2"},
	}
	wantRequests(t, leader, want...)
	wantRequests(t, follower, want...)

	// A transfer that failed on the leader is not tried on another node:
	// it may have moved the leadership already.
	busy := &fakeBroker{transfer: func(*txmqv1.TransferLeadershipRequest) (*txmqv1.TransferLeadershipResponse, error) {
		return nil, status.Error(codes.Unavailable, "leadership transfer timed out")
	}}
	busyAddr := busy.start(t)
	r := brokerctl(t, nil, "--addr", busyAddr+","+leaderAddr, "cluster", "transfer-leader")
	if want := "brokerctl: Unavailable: leadership transfer timed out (not retried: the request may have taken effect)\n"; r.code != exitFailure || r.stderr != want {
		t.Errorf("exit code %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
	wantRequests(t, leader, want...)
}

func TestClusterSnapshot(t *testing.T) {
	leader := clusterLeader()
	leaderAddr := leader.start(t)
	follower := clusterLeader()
	follower.snapshot = func(*txmqv1.TakeSnapshotRequest) (*txmqv1.TakeSnapshotResponse, error) {
		return &txmqv1.TakeSnapshotResponse{Index: 40}, nil
	}
	followerAddr := follower.start(t)

	// The snapshot is the first node's, follower or not.
	r := brokerctl(t, nil, "--addr", followerAddr+","+leaderAddr, "cluster", "snapshot")
	wantOK(t, r)
	if want := "snapshot of " + followerAddr + " at index 40\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	r = brokerctl(t, nil, "--addr", leaderAddr+","+followerAddr, "-o", "json", "cluster", "snapshot")
	wantOK(t, r)
	if want := `{"index":42}` + "\n"; r.stdout != want {
		t.Errorf("json %q, want %q", r.stdout, want)
	}
	// Neither a dead first node, retried until --timeout, nor a NotLeader
	// answer sends it elsewhere.
	r = brokerctl(t, nil, "--addr", deadAddress(t)+","+leaderAddr, "--timeout", "300ms", "cluster", "snapshot")
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "brokerctl: Unavailable: ") || !strings.HasSuffix(r.stderr, "(gave up after retrying for --timeout 300ms)\n") {
		t.Errorf("dead first node: exit code %d, stderr %q", r.code, r.stderr)
	}
	follower.follow(leaderAddr)
	r = brokerctl(t, nil, "--addr", followerAddr, "cluster", "snapshot")
	if want := "brokerctl: Unavailable: not the leader (retry with --addr " + leaderAddr + ")\n"; r.code != exitFailure || r.stderr != want {
		t.Errorf("NotLeader: exit code %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
	wantRequests(t, leader, &txmqv1.TakeSnapshotRequest{})
	wantRequests(t, follower, &txmqv1.TakeSnapshotRequest{}, &txmqv1.TakeSnapshotRequest{})
}

func TestClusterStatusFirstReachableNode(t *testing.T) {
	view := func(node, state string) func(*txmqv1.ClusterStatusRequest) (*txmqv1.ClusterStatusResponse, error) {
		return func(*txmqv1.ClusterStatusRequest) (*txmqv1.ClusterStatusResponse, error) {
			return &txmqv1.ClusterStatusResponse{NodeId: node, State: state, LeaderId: "n1", LeaderAddress: "10.0.0.1:7420"}, nil
		}
	}
	leader := &fakeBroker{clusterStatus: view("n1", "LEADER")}
	follower := &fakeBroker{clusterStatus: view("n2", "FOLLOWER")}
	leaderAddr, followerAddr := leader.start(t), follower.start(t)

	// The follower answers with its own view; nothing is redirected.
	r := brokerctl(t, nil, "--addr", deadAddress(t)+","+followerAddr+","+leaderAddr, "-o", "json", "cluster", "status")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, `{"node_id":"n2","state":"FOLLOWER","leader_id":"n1","leader_raft_address":"","leader_address":"10.0.0.1:7420",`) {
		t.Errorf("json %q", r.stdout)
	}
	wantRequests(t, follower, &txmqv1.ClusterStatusRequest{})
	wantRequests(t, leader)

	// A node that refuses with NotLeader is not followed to the leader it
	// names (alone, it is asked again until --timeout), but the next
	// address is asked.
	follower.follow(leaderAddr)
	r = brokerctl(t, nil, "--addr", followerAddr, "--timeout", "300ms", "cluster", "status")
	if want := "brokerctl: Unavailable: not the leader (gave up after retrying for --timeout 300ms) (retry with --addr " + leaderAddr + ")\n"; r.code != exitFailure || r.stderr != want {
		t.Errorf("exit code %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
	wantRequests(t, leader)
	r = brokerctl(t, nil, "--addr", followerAddr+","+leaderAddr, "cluster", "status")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, "Node:                 n1\n") || !strings.Contains(r.stdout, "Leader gRPC address:  10.0.0.1:7420\n") {
		t.Errorf("table:\n%s", r.stdout)
	}
	wantRequests(t, leader, &txmqv1.ClusterStatusRequest{})
}
