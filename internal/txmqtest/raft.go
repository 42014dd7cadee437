package txmqtest

import "github.com/txmq/txmq/raftlog"

// RaftNode is a bare Raft node as a cluster Node, for tests of raftlog
// and of what sits on it without a broker (checkback).
type RaftNode struct{ n *raftlog.Node }

// Addr is "": a bare Raft node serves no API.
func (RaftNode) Addr() string { return "" }

// Node is the Raft node.
func (r RaftNode) Node() *raftlog.Node { return r.n }

// Close closes the Raft node.
func (r RaftNode) Close() error { return r.n.Close() }

// OpenRaft is NewCluster's open function for bare Raft nodes; configure,
// when set, changes each node's config before it opens. Bare Raft nodes
// cannot join through an API: a cluster of several needs Static.
func OpenRaft(configure func(*raftlog.Config)) func(Spec) (RaftNode, error) {
	return func(s Spec) (RaftNode, error) {
		cfg := s.Raft
		if configure != nil {
			configure(&cfg)
		}
		n, err := raftlog.Open(cfg)
		return RaftNode{n}, err
	}
}
