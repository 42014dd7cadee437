package broker

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Cluster membership. Every member's gRPC address, and its RocketMQ
// address when it has one, is replicated state (SetNode), so that any node
// can tell a client where the leader serves.
// A leader records its own address when elected; a follower announces its
// own through JoinCluster on the leader, which is also how a node started
// with --join becomes a member.

// advertised is the gRPC address other nodes and clients reach this one at.
func (b *Broker) advertised() string {
	if b.cfg.GRPCAdvertise != "" {
		return b.cfg.GRPCAdvertise
	}
	return b.Addr()
}

// nodeAddr is where a member serves the API, "" if unknown.
func (b *Broker) nodeAddr(id string) string {
	if id == b.node.ID() {
		return b.advertised()
	}
	return b.nodeRecord(id).GetGrpcAddress()
}

// RocketMQAddr is where RocketMQ clients reach a member's remoting
// listener, as it announced it; "" if unknown or it has none.
func (b *Broker) RocketMQAddr(id string) string {
	if id == b.node.ID() {
		return b.cfg.RocketMQAdvertise
	}
	return b.nodeRecord(id).GetRocketmqAddress()
}

// nodeRecord is a member's replicated record; nil if it cannot be read.
func (b *Broker) nodeRecord(id string) *storepb.Node {
	var n *storepb.Node
	_ = b.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		n, err = tx.Node(id)
		return err
	})
	return n
}

// self is this node's record as it announces it.
func (b *Broker) self() *raftpb.SetNode {
	return &raftpb.SetNode{Id: b.node.ID(), GrpcAddress: b.advertised(), RocketmqAddress: b.cfg.RocketMQAdvertise}
}

// announce keeps this node's addresses in the replicated member list:
// directly when leader, through the leader's JoinCluster otherwise (which
// also makes a --join node a member). It retries until done or stop.
func (b *Broker) announce() {
	// Close waits for announce: the retries of a join must not hold it up.
	stopped, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		defer cancel()
		select {
		case <-b.stop:
		case <-stopped.Done():
		}
	}()
	wait := 50 * time.Millisecond
	for {
		select {
		case <-stopped.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
		if b.recorded() {
			return
		}
		ctx, cancelTry := context.WithTimeout(stopped, 10*time.Second)
		err := b.announceOnce(ctx)
		cancelTry()
		if err == nil {
			if b.recorded() {
				return
			}
			continue
		}
		b.log.Debug("announcing this node to the leader", "err", err)
	}
}

// recorded reports whether the replicated member list has this node's
// addresses as they are now.
func (b *Broker) recorded() bool {
	n, want := b.nodeRecord(b.node.ID()), b.self()
	return n.GetGrpcAddress() == want.GrpcAddress && n.GetRocketmqAddress() == want.RocketmqAddress
}

func (b *Broker) announceOnce(ctx context.Context) error {
	if b.node.IsLeader() {
		return b.node.SetNode(ctx, b.self())
	}
	targets := b.cfg.Join
	if id, _ := b.node.Leader(); id != "" {
		if addr := b.nodeAddr(id); addr != "" {
			targets = append([]string{addr}, targets...)
		}
	}
	if len(targets) == 0 {
		return errors.New("no leader known yet and no --join address")
	}
	// Joining through a member is a client's call of the admin API: the Go
	// client's connection follows NotLeader to the leader and retries while
	// there is none, until ctx ends.
	conn, err := txmq.Dial(txmq.ConnConfig{Addrs: targets, TLS: b.peerTLS(), Logger: b.log, Token: b.cfg.PeerToken})
	if err != nil {
		return err
	}
	defer conn.Close()
	self := b.self()
	req := &txmqv1.JoinClusterRequest{NodeId: self.Id, RaftAddress: b.node.RaftAddr(), GrpcAddress: self.GrpcAddress, RocketmqAddress: self.RocketmqAddress}
	var resp *txmqv1.JoinClusterResponse
	var via string
	err = conn.Invoke(ctx, true, func(ctx context.Context, addr string, cc grpc.ClientConnInterface, opts ...grpc.CallOption) error {
		via = addr
		var err error
		resp, err = txmqv1.NewAdminServiceClient(cc).JoinCluster(ctx, req, opts...)
		return err
	})
	if err != nil {
		return err
	}
	if resp.Added {
		b.log.Info("joined the cluster", "via", via)
	}
	return nil
}

// checkRocketMQAddr refuses a RocketMQ address that is not an IPv4
// address and port, which is all RocketMQ message IDs can carry; "" is
// none.
func checkRocketMQAddr(addr string) error {
	if addr == "" {
		return nil
	}
	if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().Unmap().Is4() {
		return fmt.Errorf("RocketMQ address %q is not an IPv4 address and port", addr)
	}
	return nil
}

func (s *adminService) JoinCluster(ctx context.Context, req *txmqv1.JoinClusterRequest) (*txmqv1.JoinClusterResponse, error) {
	b := s.b
	if err := checkName("node_id", req.NodeId); err != nil {
		return nil, err
	}
	if _, err := checkback.GRPCEndpoint(req.RaftAddress); err != nil {
		return nil, invalidf("raft_address: %v", err)
	}
	if req.GrpcAddress != "" {
		if _, err := checkback.GRPCEndpoint(req.GrpcAddress); err != nil {
			return nil, invalidf("grpc_address: %v", err)
		}
	}
	if err := checkRocketMQAddr(req.RocketmqAddress); err != nil {
		return nil, invalidf("rocketmq_address: %v", err)
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	added, err := b.node.AddVoter(req.NodeId, req.RaftAddress)
	if err != nil {
		return nil, err
	}
	if req.GrpcAddress != "" {
		rec := &raftpb.SetNode{Id: req.NodeId, GrpcAddress: req.GrpcAddress, RocketmqAddress: req.RocketmqAddress}
		if err := b.node.SetNode(ctx, rec); err != nil {
			return nil, err
		}
	}
	if added {
		b.log.Info("node joined", "joined", req.NodeId, "raft_addr", req.RaftAddress, "grpc_addr", req.GrpcAddress)
	}
	return &txmqv1.JoinClusterResponse{Added: added}, nil
}

func (s *adminService) RemoveNode(ctx context.Context, req *txmqv1.RemoveNodeRequest) (*txmqv1.RemoveNodeResponse, error) {
	b := s.b
	if err := checkName("node_id", req.NodeId); err != nil {
		return nil, err
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	if err := b.node.RemoveServer(req.NodeId); err != nil {
		return nil, err
	}
	if err := b.node.SetNode(ctx, &raftpb.SetNode{Id: req.NodeId}); err != nil {
		return nil, err
	}
	b.log.Info("node removed", "removed", req.NodeId)
	return &txmqv1.RemoveNodeResponse{}, nil
}

func (s *adminService) TransferLeadership(ctx context.Context, req *txmqv1.TransferLeadershipRequest) (*txmqv1.TransferLeadershipResponse, error) {
	b := s.b
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	if err := b.node.TransferLeadership(req.NodeId); err != nil {
		return nil, err
	}
	// The transfer is done when the new leader's first heartbeat arrives:
	// wait (briefly) to name it.
	id := ""
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if id, _ = b.node.Leader(); id != "" && id != b.node.ID() {
			break
		}
	}
	return &txmqv1.TransferLeadershipResponse{LeaderId: id}, nil
}

func (s *adminService) TakeSnapshot(ctx context.Context, _ *txmqv1.TakeSnapshotRequest) (*txmqv1.TakeSnapshotResponse, error) {
	idx, err := s.b.node.Snapshot()
	if err != nil {
		return nil, err
	}
	return &txmqv1.TakeSnapshotResponse{Index: idx}, nil
}
