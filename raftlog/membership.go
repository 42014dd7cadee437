package raftlog

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hashicorp/raft"
)

// Cluster status and membership changes.

// Member is one server of the Raft configuration.
type Member struct {
	ID       string
	RaftAddr string
	Suffrage string
	Leader   bool
}

// Status is what `brokerctl cluster status` shows of this node.
type Status struct {
	NodeID            string
	State             string
	LeaderID          string
	LeaderRaftAddr    string
	Term              uint64
	CommitIndex       uint64
	AppliedIndex      uint64
	LastLogIndex      uint64
	StoreAppliedIndex uint64
	Members           []Member
}

// Status reads the node's Raft state and membership.
func (n *Node) Status() (Status, error) {
	stats := n.raft.Stats()
	num := func(k string) uint64 {
		v, _ := strconv.ParseUint(stats[k], 10, 64)
		return v
	}
	st := Status{
		NodeID:       n.cfg.NodeID,
		State:        n.raft.State().String(),
		Term:         num("term"),
		CommitIndex:  num("commit_index"),
		AppliedIndex: num("applied_index"),
		LastLogIndex: num("last_log_index"),
	}
	st.LeaderID, st.LeaderRaftAddr = n.Leader()
	var err error
	if st.StoreAppliedIndex, err = n.store.AppliedIndex(); err != nil {
		return st, err
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return st, fmt.Errorf("raftlog: configuration: %w", err)
	}
	for _, s := range f.Configuration().Servers {
		st.Members = append(st.Members, Member{
			ID:       string(s.ID),
			RaftAddr: string(s.Address),
			Suffrage: s.Suffrage.String(),
			Leader:   string(s.ID) == st.LeaderID,
		})
	}
	return st, nil
}

// Voters lists the IDs of the voting members of the latest configuration.
func (n *Node) Voters() ([]string, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, fmt.Errorf("raftlog: configuration: %w", err)
	}
	var ids []string
	for _, s := range f.Configuration().Servers {
		if s.Suffrage == raft.Voter {
			ids = append(ids, string(s.ID))
		}
	}
	return ids, nil
}

// Snapshot takes a snapshot now, truncates the log behind it, and returns
// the index it covers.
func (n *Node) Snapshot() (uint64, error) {
	f := n.raft.Snapshot()
	if err := f.Error(); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	meta, rc, err := f.Open()
	if err != nil {
		return 0, fmt.Errorf("raftlog: snapshot: %w", err)
	}
	rc.Close()
	return meta.Index, nil
}

// membershipTimeout bounds a configuration change.
const membershipTimeout = 30 * time.Second

func (n *Node) leaderErr(err error) error {
	if errors.Is(err, raft.ErrNotLeader) || errors.Is(err, raft.ErrLeadershipLost) {
		return n.notLeader()
	}
	return err
}

// AddVoter makes a node a voting member (leader only). It reports false
// when the node already was one at that address.
func (n *Node) AddVoter(id, raftAddr string) (bool, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return false, err
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id && string(s.Address) == raftAddr && s.Suffrage == raft.Voter {
			return false, nil
		}
	}
	if err := n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, membershipTimeout).Error(); err != nil {
		return false, n.leaderErr(err)
	}
	return true, nil
}

// RemoveServer takes a node out of the cluster (leader only).
func (n *Node) RemoveServer(id string) error {
	return n.leaderErr(n.raft.RemoveServer(raft.ServerID(id), 0, membershipTimeout).Error())
}

// TransferLeadership hands leadership to the node id, or to the most
// up-to-date follower when id is empty (leader only).
func (n *Node) TransferLeadership(id string) error {
	if id == "" {
		return n.leaderErr(n.raft.LeadershipTransfer().Error())
	}
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return err
	}
	if id == n.cfg.NodeID {
		return fmt.Errorf("%w: node %s is the leader", ErrIsLeader, id)
	}
	for _, s := range f.Configuration().Servers {
		if string(s.ID) == id {
			return n.leaderErr(n.raft.LeadershipTransferToServer(s.ID, s.Address).Error())
		}
	}
	return fmt.Errorf("%w: node %q", ErrNotMember, id)
}
