package txmqtest

import (
	"time"

	"github.com/txmq/txmq/raftlog"
)

// RaftTimings sets the Raft timers tests run with on cfg, for a node that
// is one of voters: 50 ms alone (its elections are instant anyway), 200 ms
// in a cluster, long enough that a loaded 2-core CI machine does not see
// leaders flap and short enough for quick failovers.
func RaftTimings(cfg *raftlog.Config, voters int) {
	timer := 50 * time.Millisecond
	if voters > 1 {
		timer = 200 * time.Millisecond
	}
	cfg.HeartbeatTimeout = timer
	cfg.ElectionTimeout = timer
	cfg.LeaderLeaseTimeout = timer
	cfg.CommitTimeout = 5 * time.Millisecond
}
