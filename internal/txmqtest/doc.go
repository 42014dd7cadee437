// Package txmqtest is txmq's one test harness, imported by tests only: one
// way to start a node or a cluster (NewCluster), one polling helper
// (CheckFor), one set of Raft test timings (RaftTimings), listeners handed
// over instead of ports chosen twice (Listen, ListenOn), one goroutine leak
// check (VerifyTestMain), one fault network for Raft links (FaultNet), and
// one check that a cluster's stores agree (VerifyStores), which every
// cluster test ends with.
//
// The harness does not import package broker, so that broker's own tests
// (package broker, which cannot import a package that imports broker) use
// it as the tests of client/go and cmd do. A Cluster is generic over a
// small Node interface (API address, Raft node, Close) and starts nodes
// with an open function its caller passes: the harness builds the node's
// Raft config, listeners and join addresses (a Spec), and the caller turns
// them into a broker.Config and calls broker.Open, or opens a bare Raft
// node (OpenRaft). The few lines that map a Spec to a broker.Config live
// beside each package's tests; everything else lives here once.
//
// Package halfstore keeps a polling helper of its own: its tests are
// inside the package, and this one imports raftlog, which imports
// halfstore.
package txmqtest
