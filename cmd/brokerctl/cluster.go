package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// runClusterStatus shows the cluster as the first node of --addr that
// answers sees it: every node answers, and a follower's view is what an
// operator may want to compare with the leader's.
func runClusterStatus(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toAny, txmqv1.AdminServiceClient.ClusterStatus, &txmqv1.ClusterStatusRequest{})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		out := clusterJSON{
			NodeID:            resp.GetNodeId(),
			State:             resp.GetState(),
			LeaderID:          resp.GetLeaderId(),
			LeaderRaftAddress: resp.GetLeaderRaftAddress(),
			LeaderAddress:     resp.GetLeaderAddress(),
			Term:              resp.GetTerm(),
			CommitIndex:       resp.GetCommitIndex(),
			AppliedIndex:      resp.GetAppliedIndex(),
			LastLogIndex:      resp.GetLastLogIndex(),
			StoreAppliedIndex: resp.GetStoreAppliedIndex(),
			Nodes:             []clusterNodeJSON{},
		}
		for _, n := range resp.GetNodes() {
			out.Nodes = append(out.Nodes, clusterNodeJSON{
				ID:           n.GetId(),
				RaftAddress:  n.GetRaftAddress(),
				GrpcAddress:  n.GetGrpcAddress(),
				Suffrage:     n.GetSuffrage(),
				Leader:       n.GetLeader(),
				Reachable:    n.GetReachable(),
				State:        n.GetState(),
				AppliedIndex: n.GetAppliedIndex(),
				Lag:          n.GetLag(),
			})
		}
		return c.printJSON(out)
	}
	leader := "-"
	if resp.GetLeaderId() != "" {
		leader = fmt.Sprintf("%s (%s)", resp.GetLeaderId(), resp.GetLeaderRaftAddress())
	}
	err = printFields(c.stdout, [][2]string{
		{"Node", resp.GetNodeId()},
		{"State", resp.GetState()},
		{"Leader", leader},
		{"Leader gRPC address", orDash(resp.GetLeaderAddress())},
		{"Term", strconv.FormatUint(resp.GetTerm(), 10)},
		{"Commit index", strconv.FormatUint(resp.GetCommitIndex(), 10)},
		{"Applied index", strconv.FormatUint(resp.GetAppliedIndex(), 10)},
		{"Last log index", strconv.FormatUint(resp.GetLastLogIndex(), 10)},
		{"Store applied index", strconv.FormatUint(resp.GetStoreAppliedIndex(), 10)},
	})
	if err != nil {
		return err
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "\nNODE-ID\tRAFT-ADDRESS\tGRPC-ADDRESS\tSUFFRAGE\tLEADER\tSTATE\tAPPLIED\tLAG")
	for _, n := range resp.GetNodes() {
		state, applied, lag := "unreachable", "-", "-"
		if n.GetReachable() {
			state, applied, lag = n.GetState(), strconv.FormatUint(n.GetAppliedIndex(), 10), strconv.FormatUint(n.GetLag(), 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%t\t%s\t%s\t%s\n", n.GetId(), n.GetRaftAddress(), orDash(n.GetGrpcAddress()),
			n.GetSuffrage(), n.GetLeader(), state, applied, lag)
	}
	return tw.Flush()
}

// runClusterJoin adds a node as a voter (AdminService.JoinCluster, on the
// leader). Joining is idempotent: a member joins again without change.
func runClusterJoin(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	grpcAddr := fs.String("grpc", "", "`address` where the node serves the gRPC API, host:port; recorded for clients and cluster status")
	pos, err := c.start(fs, args, "NODE_ID", "RAFT_ADDR")
	if err != nil {
		return err
	}
	switch {
	case pos[0] == "":
		return c.usageError(fs, "NODE_ID must not be empty")
	case checkHostPort(pos[1]) != nil:
		return c.usageError(fs, "RAFT_ADDR %q: %v", pos[1], checkHostPort(pos[1]))
	case flagGiven(fs, "grpc") && checkHostPort(*grpcAddr) != nil:
		return c.usageError(fs, "--grpc %q: %v", *grpcAddr, checkHostPort(*grpcAddr))
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.JoinCluster, &txmqv1.JoinClusterRequest{
		NodeId:      pos[0],
		RaftAddress: pos[1],
		GrpcAddress: *grpcAddr,
	})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(clusterJoinJSON{NodeID: pos[0], Added: resp.GetAdded()})
	}
	outcome := "added"
	if !resp.GetAdded() {
		outcome = "already a member"
	}
	_, err = fmt.Fprintf(c.stdout, "node %s %s\n", pos[0], outcome)
	return err
}

// runClusterRemove removes a node from the cluster (AdminService.RemoveNode,
// on the leader).
func runClusterRemove(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	force := forceFlag(fs)
	pos, err := c.start(fs, args, "NODE_ID")
	if err != nil {
		return err
	}
	if pos[0] == "" {
		return c.usageError(fs, "NODE_ID must not be empty")
	}
	if !*force {
		if err := confirm(c, "remove node "+pos[0]+" from the cluster"); err != nil {
			return err
		}
	}
	// Repeated after it took effect, a removal fails with NotFound.
	if _, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.RemoveNode, &txmqv1.RemoveNodeRequest{NodeId: pos[0]}); err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(clusterNodeIDJSON{NodeID: pos[0]})
	}
	_, err = fmt.Fprintf(c.stdout, "node %s removed\n", pos[0])
	return err
}

// runClusterTransferLeader hands the leadership to a node, or to the most
// up-to-date follower (AdminService.TransferLeadership, on the leader). It
// is not sent to another node after an ambiguous failure, which could move
// the leadership twice.
func runClusterTransferLeader(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "[NODE_ID]")
	if err != nil {
		return err
	}
	req := &txmqv1.TransferLeadershipRequest{}
	if len(pos) == 1 {
		if pos[0] == "" {
			return c.usageError(fs, "NODE_ID must not be empty; leave it out to let the broker choose")
		}
		req.NodeId = pos[0]
	}
	resp, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.TransferLeadership, req)
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(clusterLeaderJSON{LeaderID: resp.GetLeaderId()})
	}
	_, err = fmt.Fprintf(c.stdout, "leader is now %s\n", orDash(resp.GetLeaderId()))
	return err
}

// runClusterSnapshot snapshots one node (AdminService.TakeSnapshot): the
// first of --addr, never another, since a snapshot is per node.
func runClusterSnapshot(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toFirst, txmqv1.AdminServiceClient.TakeSnapshot, &txmqv1.TakeSnapshotRequest{})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(snapshotJSON{Index: resp.GetIndex()})
	}
	_, err = fmt.Fprintf(c.stdout, "snapshot of %s at index %d\n", c.addrs[0], resp.GetIndex())
	return err
}
