package txmqtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/raftlog"
)

// Node is what a Cluster is made of: a broker, or a bare Raft node.
type Node interface {
	// Addr is where the node serves the API, "" for a bare Raft node.
	Addr() string
	Node() *raftlog.Node
	Close() error
}

// Spec is what a Cluster hands its open function to start one node with.
type Spec struct {
	// Raft is complete: node ID, data directory, a listener (or a layer
	// of the fault network), bootstrap or peers, the test timings and a
	// quiet logger.
	Raft raftlog.Config
	// API is the listener to serve the API on, at the same address
	// across restarts. A bare Raft node leaves it alone.
	API net.Listener
	// Join lists API addresses to join the cluster through, if any.
	Join []string
}

// Option changes how NewCluster forms and runs a cluster.
type Option func(*options)

type options struct {
	static bool
	faults *FaultNet
	voters int
}

// Static starts the first nodes with the whole membership (raftlog Peers,
// the --peers of cmd/broker), instead of n1 alone with the others joining
// through it.
func Static() Option { return func(o *options) { o.static = true } }

// Faults carries the cluster's Raft traffic through f.
func Faults(f *FaultNet) Option { return func(o *options) { o.faults = f } }

// Voters gives the nodes the Raft timings of a cluster of n voters, for a
// cluster that starts smaller than it grows.
func Voters(n int) Option { return func(o *options) { o.voters = n } }

// Cluster runs nodes in the test's process, on 127.0.0.1, each in its own
// directory, and keeps their addresses across restarts. Its methods may be
// called from several goroutines. Nodes still running when the test ends
// are closed.
type Cluster[N Node] struct {
	t    testing.TB
	open func(Spec) (N, error)
	opts options

	mu      sync.Mutex
	members map[string]*member
	running map[string]*instance[N]
}

// member is what stays of a node across restarts.
type member struct {
	dir, raftAddr, apiAddr string
	// bootstrap: one of the nodes that form the cluster.
	bootstrap bool
	peers     []raftlog.Peer
	// announces: the node serves an API and records its address in the
	// replicated member list.
	announces bool
}

// instance is one run of a node, from Start to Stop, with the listeners it
// was handed.
type instance[N Node] struct {
	node N
	lis  []net.Listener
}

// NewCluster starts nodes n1 to nN with open and waits until every one of
// them sees all as members and a leader has applied what was committed.
// With n 0 it starts nothing: the test starts nodes itself.
func NewCluster[N Node](t testing.TB, n int, open func(Spec) (N, error), opts ...Option) *Cluster[N] {
	t.Helper()
	c := &Cluster[N]{t: t, open: open, opts: options{voters: n}, members: map[string]*member{}, running: map[string]*instance[N]{}}
	for _, o := range opts {
		o(&c.opts)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("n", i+1)
	}
	if c.opts.static {
		c.startStatic(ids)
	} else {
		for i, id := range ids {
			_, raftL, apiL := c.newMember(id, i == 0)
			var join []string
			if i > 0 {
				join = []string{c.member("n1").apiAddr}
			}
			c.start(id, raftL, apiL, join)
		}
	}
	if n > 0 {
		c.WaitMembers(n)
		c.Leader()
	}
	return c
}

// startStatic starts nodes that all know the whole membership from the
// start, so every address is taken before any node starts.
func (c *Cluster[N]) startStatic(ids []string) {
	var peers []raftlog.Peer
	lis := map[string][2]net.Listener{}
	for _, id := range ids {
		m, raftL, apiL := c.newMember(id, true)
		peers = append(peers, raftlog.Peer{ID: id, RaftAddr: m.raftAddr})
		lis[id] = [2]net.Listener{raftL, apiL}
	}
	for _, id := range ids {
		c.member(id).peers = peers
		c.start(id, lis[id][0], lis[id][1], nil)
	}
}

func (c *Cluster[N]) newMember(id string, bootstrap bool) (*member, net.Listener, net.Listener) {
	raftL, apiL := Listen(c.t), Listen(c.t)
	m := &member{dir: c.t.TempDir(), raftAddr: raftL.Addr().String(), apiAddr: apiL.Addr().String(), bootstrap: bootstrap}
	c.mu.Lock()
	c.members[id] = m
	c.mu.Unlock()
	return m, raftL, apiL
}

// Start starts a node: a new one (which joins through join, or waits for
// a voter to add it), or a stopped one again, at its addresses and on its
// data (which joins through join if it was wiped). It does not wait for
// the node to catch up or the cluster to elect.
func (c *Cluster[N]) Start(id string, join ...string) N {
	c.t.Helper()
	c.mu.Lock()
	m, running := c.members[id], c.running[id] != nil
	c.mu.Unlock()
	switch {
	case running:
		c.t.Fatalf("txmqtest: start %s: already running", id)
	case m == nil:
		_, raftL, apiL := c.newMember(id, false)
		return c.start(id, raftL, apiL, join)
	}
	return c.start(id, ListenOn(c.t, m.raftAddr), ListenOn(c.t, m.apiAddr), join)
}

func (c *Cluster[N]) start(id string, raftL, apiL net.Listener, join []string) N {
	c.t.Helper()
	c.mu.Lock()
	m := c.members[id]
	c.mu.Unlock()
	cfg := raftlog.Config{
		NodeID: id, Dir: m.dir, Peers: m.peers, Logger: Logger(),
		// A node told to join never starts a cluster of its own.
		Bootstrap: m.bootstrap && len(join) == 0,
	}
	RaftTimings(&cfg, c.opts.voters)
	if c.opts.faults != nil {
		cfg.StreamLayer = c.opts.faults.Layer(raftL)
	} else {
		cfg.Listener = raftL
	}
	node, err := c.open(Spec{Raft: cfg, API: apiL, Join: join})
	if err != nil {
		c.t.Fatalf("txmqtest: start %s: %v", id, err)
	}
	inst := &instance[N]{node: node, lis: []net.Listener{raftL, apiL}}
	c.mu.Lock()
	m.announces = node.Addr() != ""
	c.running[id] = inst
	c.mu.Unlock()
	// Registered after the listeners' own cleanups, so it runs first.
	c.t.Cleanup(func() { c.stop(id, inst) })
	return node
}

// Stop closes a running node, without handing over leadership.
func (c *Cluster[N]) Stop(id string) {
	c.t.Helper()
	c.mu.Lock()
	inst := c.running[id]
	c.mu.Unlock()
	if inst == nil {
		c.t.Errorf("txmqtest: stop %s: not running", id)
		return
	}
	c.stop(id, inst)
}

// stop closes inst if it is still the running instance of id.
func (c *Cluster[N]) stop(id string, inst *instance[N]) {
	c.mu.Lock()
	if c.running[id] != inst {
		c.mu.Unlock()
		return
	}
	delete(c.running, id)
	c.mu.Unlock()
	// A Close that hangs fails the test instead of holding it until the
	// binary's timeout; the node's goroutines are then left behind.
	done := make(chan error, 1)
	go func() { done <- inst.node.Close() }()
	select {
	case err := <-done:
		if err != nil {
			c.t.Errorf("txmqtest: stop %s: %v", id, err)
		}
	case <-time.After(closeTimeout):
		c.t.Errorf("txmqtest: stop %s: Close has not returned after %s", id, closeTimeout)
	}
	// The node closed them, unless it left one unused (a bare Raft node
	// its API listener): the addresses are free for a restart.
	for _, l := range inst.lis {
		l.Close()
	}
}

// closeTimeout bounds a node's Close.
const closeTimeout = 30 * time.Second

// Restart stops a node and starts it again on its data and addresses.
func (c *Cluster[N]) Restart(id string) N {
	c.t.Helper()
	c.Stop(id)
	return c.Start(id)
}

// Wipe deletes a stopped node's data: it starts again as a new member.
func (c *Cluster[N]) Wipe(id string) {
	c.t.Helper()
	if _, running := c.Node(id); running {
		c.t.Fatalf("txmqtest: wipe %s: still running", id)
	}
	if err := os.RemoveAll(c.Dir(id)); err != nil {
		c.t.Fatalf("txmqtest: wipe %s: %v", id, err)
	}
}

// Node returns a running node.
func (c *Cluster[N]) Node(id string) (N, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	inst, ok := c.running[id]
	if !ok {
		var zero N
		return zero, false
	}
	return inst.node, true
}

// Nodes returns the running nodes, by ID.
func (c *Cluster[N]) Nodes() []N {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []N
	for _, id := range sortedKeys(c.running) {
		out = append(out, c.running[id].node)
	}
	return out
}

// Addrs returns the API address of every node ever started, running or
// not, by ID: what a client is configured with.
func (c *Cluster[N]) Addrs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, id := range sortedKeys(c.members) {
		out = append(out, c.members[id].apiAddr)
	}
	return out
}

// RaftAddr is a node's Raft address, the same across restarts.
func (c *Cluster[N]) RaftAddr(id string) string { return c.member(id).raftAddr }

// Dir is a node's data directory.
func (c *Cluster[N]) Dir(id string) string { return c.member(id).dir }

func (c *Cluster[N]) member(id string) *member {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.members[id]
	if m == nil {
		c.t.Fatalf("txmqtest: no node %s", id)
	}
	return m
}

// WaitMembers waits until every running node sees n members in its Raft
// configuration and knows the API address of each that serves one.
func (c *Cluster[N]) WaitMembers(n int) {
	c.t.Helper()
	CheckFor(c.t, 30*time.Second, 20*time.Millisecond, func() error {
		for _, node := range c.Nodes() {
			if err := c.knows(node.Node(), n); err != nil {
				return err
			}
		}
		return nil
	})
}

func (c *Cluster[N]) knows(node *raftlog.Node, n int) error {
	st, err := node.Status()
	if err != nil {
		return err
	}
	if len(st.Members) != n {
		return fmt.Errorf("%s sees %d members, not %d", node.ID(), len(st.Members), n)
	}
	for _, m := range st.Members {
		c.mu.Lock()
		announces := c.members[m.ID] != nil && c.members[m.ID].announces
		c.mu.Unlock()
		if !announces {
			continue
		}
		var addr string
		if err := node.Store().View(func(tx *halfstore.Tx) error {
			addr, err = tx.NodeAddr(m.ID)
			return err
		}); err != nil {
			return err
		}
		if addr == "" {
			return fmt.Errorf("%s does not know %s's API address", node.ID(), m.ID)
		}
	}
	return nil
}

// Leader waits until the running nodes agree on a leader and that leader
// has applied everything committed before (a Raft barrier), and returns it.
func (c *Cluster[N]) Leader() N {
	c.t.Helper()
	var leader N
	CheckFor(c.t, 30*time.Second, 20*time.Millisecond, func() error {
		var err error
		if leader, err = c.agreedLeader(); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return leader.Node().Barrier(ctx)
	})
	return leader
}

func (c *Cluster[N]) agreedLeader() (N, error) {
	leader, ok := c.CurrentLeader()
	if !ok {
		return leader, fmt.Errorf("no leader")
	}
	for _, n := range c.Nodes() {
		if l, _ := n.Node().Leader(); l != leader.Node().ID() {
			return leader, fmt.Errorf("%s follows %q, not %s", n.Node().ID(), l, leader.Node().ID())
		}
	}
	return leader, nil
}

// CurrentLeader returns a running node that believes it is the leader,
// without waiting.
func (c *Cluster[N]) CurrentLeader() (N, bool) {
	for _, n := range c.Nodes() {
		if n.Node().IsLeader() {
			return n, true
		}
	}
	var zero N
	return zero, false
}

// Follower waits for a leader (see Leader) and returns another running
// node.
func (c *Cluster[N]) Follower() N {
	c.t.Helper()
	leader := c.Leader()
	for _, n := range c.Nodes() {
		if n.Node().ID() != leader.Node().ID() {
			return n
		}
	}
	c.t.Fatalf("txmqtest: no follower")
	return leader
}

// VerifyStores checks that the running nodes hold the same data (see
// VerifyStores). Every cluster test ends with it.
func (c *Cluster[N]) VerifyStores() {
	c.t.Helper()
	var nodes []*raftlog.Node
	for _, n := range c.Nodes() {
		nodes = append(nodes, n.Node())
	}
	VerifyStores(c.t, nodes...)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
