package txmqtest

import (
	"testing"

	"go.uber.org/goleak"
)

// VerifyTestMain runs a package's tests, then fails the run if they left
// goroutines behind, apart from those hashicorp/raft and raftlog leave on
// purpose.
func VerifyTestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// hashicorp/raft leaves these behind for a moment after Shutdown.
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*NetworkTransport).listen"),
		goleak.IgnoreTopFunction("github.com/hashicorp/raft.(*Raft).runSnapshots"),
		// Closing a NetworkTransport leaves connections accepted from
		// peers to end when the peers close them.
		goleak.IgnoreAnyFunction("github.com/hashicorp/raft.(*NetworkTransport).handleConn"),
		// A proposal caught by Shutdown between commit and apply is never
		// answered (see raftlog.waitApplied).
		goleak.IgnoreAnyFunction("github.com/txmq/txmq/raftlog.waitApplied"),
	)
}
