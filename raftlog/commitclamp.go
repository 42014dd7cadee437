package raftlog

import (
	"sync"

	"github.com/hashicorp/raft"
)

// commitClamp is the Raft transport with one correction of what a follower
// hears: the commit index an AppendEntries carries is lowered to the last
// entry the request proves the follower shares with the leader (its
// previous entry, or the last of its entries).
//
// hashicorp/raft (v1.7.3, raft.go appendEntries) sets a follower's commit
// index to min(leaderCommit, the follower's last index), where the Raft
// paper says min(leaderCommit, index of the last new entry). The two differ
// when the follower still holds entries of an old term past what the
// request covers: a leader that captured its last index before its no-op
// was appended, and read its commit index after the no-op committed, sends
// "previous entry 29, no entries, commit 30" to an old leader whose own
// uncommitted entry 30 is still in its log, and that node applies it. Seen
// in TestClusterLeaderLosesWhatItSends (about 1 run in 100 under load): the
// old leader applied a write that was never committed and its store
// diverged from the others'. With the clamp the follower commits 30 only
// once a request has carried the leader's entry 30 (after truncating its
// own), as the paper has it.
//
// Two more corrections come from a leader that syncs its appends behind
// them (logStore.StoreLogs): hashicorp/raft counts the leader's entries in
// the quorum as soon as they are written, so
//   - what the leader sends carries a commit index no higher than its log's
//     durable index: a follower applies an entry only once two nodes hold
//     it durably, the leader and a follower that answered after its fsync;
//   - a node syncs its log before Raft reads any request: an old leader
//     that answers as a follower, or votes, does so with a durable log.
type commitClamp struct {
	*raft.NetworkTransport
	logs     durableLog
	out      chan raft.RPC
	stop     chan struct{}
	stopOnce sync.Once
}

// durableLog is what the transport asks of this node's log store.
type durableLog interface {
	// durable is the last index this node holds durably.
	durable() uint64
	// sync makes every entry stored so far durable.
	sync()
}

func newCommitClamp(t *raft.NetworkTransport, logs durableLog) *commitClamp {
	c := &commitClamp{NetworkTransport: t, logs: logs, out: make(chan raft.RPC), stop: make(chan struct{})}
	go c.forward()
	return c
}

// AppendEntries sends req with its commit index lowered to the leader's
// durable index. Every append goes through it: the transport does not
// pipeline (newTransport).
func (c *commitClamp) AppendEntries(id raft.ServerID, target raft.ServerAddress, req *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	req.LeaderCommitIndex = min(req.LeaderCommitIndex, c.logs.durable())
	return c.NetworkTransport.AppendEntries(id, target, req, resp)
}

func (c *commitClamp) forward() {
	in := c.NetworkTransport.Consumer()
	for {
		select {
		case rpc := <-in:
			c.logs.sync()
			if req, ok := rpc.Command.(*raft.AppendEntriesRequest); ok {
				clampCommit(req)
			}
			select {
			case c.out <- rpc:
			case <-c.stop:
				return
			}
		case <-c.stop:
			return
		}
	}
}

// clampCommit lowers req's commit index to the last entry it proves.
func clampCommit(req *raft.AppendEntriesRequest) {
	proven := req.PrevLogEntry
	if n := len(req.Entries); n > 0 {
		proven = req.Entries[n-1].Index
	}
	req.LeaderCommitIndex = min(req.LeaderCommitIndex, proven)
}

// Consumer is what Raft reads requests from.
func (c *commitClamp) Consumer() <-chan raft.RPC { return c.out }

// Close stops the forwarding and closes the transport.
func (c *commitClamp) Close() error {
	c.stopOnce.Do(func() { close(c.stop) })
	return c.NetworkTransport.Close()
}
