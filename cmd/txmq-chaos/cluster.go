package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/cmd/txmq-chaos/lazyfs"
	"github.com/txmq/txmq/internal/loopback"
)

// brokerFlags are the broker settings of a chaos run: short check-back and
// redelivery timers, so that a drain after the faults takes seconds.
var brokerFlags = []string{
	"--check-after", "1s", "--check-backoff", "1s", "--max-check-backoff", "2s", "--check-timeout", "2s",
	"--ack-deadline", "5s", "--redelivery-backoff", "100ms,500ms,1s",
	"--metrics-listen", "", "--snapshot-threshold", "2048", "--snapshot-interval", "10s",
}

// node is one broker process: its addresses stay the same across restarts.
type node struct {
	id      string
	dir     string // data directory
	logPath string
	grpc    string
	raft    string   // the real Raft listener
	proxy   *Proxy   // what the node advertises
	extra   []string // more broker flags for its next starts (clock)

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
}

// Cluster is the broker processes of a run and the network between them.
type Cluster struct {
	bin   string
	root  string
	nodes []*node
	net   *Net
	conn  map[string]*grpc.ClientConn
	log   func(format string, args ...any)
	// lazy are the nodes' lazy file systems, when their data directories
	// are mounted on one (MountLazy).
	lazy map[string]*lazyfs.FS
	// bootID is the file the brokers read the machine's boot ID from
	// (--boot-id-file), with the lazy file system: a power cut writes a
	// new one (NewBoot).
	bootID string
}

// NewBoot writes a new boot ID for the brokers' next starts: the machine
// rebooted.
func (c *Cluster) NewBoot() error {
	id := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	return os.WriteFile(c.bootID, []byte(id+"\n"), 0o644)
}

// MountLazy puts every node's data directory on a lazy file system whose
// backing directory is next to it (n1.disk).
func (c *Cluster) MountLazy(cfg lazyfs.Config) error {
	if err := lazyfs.Available(); err != nil {
		return err
	}
	if err := os.MkdirAll(c.root, 0o755); err != nil {
		return err
	}
	c.bootID = filepath.Join(c.root, "boot_id")
	if err := c.NewBoot(); err != nil {
		return err
	}
	c.lazy = map[string]*lazyfs.FS{}
	for _, n := range c.nodes {
		backing := n.dir + ".disk"
		for _, d := range []string{backing, n.dir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
		l, err := lazyfs.Mount(backing, n.dir, cfg)
		if err != nil {
			c.unmountLazy()
			return err
		}
		c.lazy[n.id] = l
	}
	return nil
}

// StoreDir is where this process reads node id's files: the backing
// directory when the node is on the lazy file system. This process serves
// that file system, so it must not read it, least of all through bbolt's
// mmap: a page fault that waits for this process's own FUSE server can
// deadlock with the Go runtime stopping the world.
func (c *Cluster) StoreDir(id string) string {
	if c.lazy != nil {
		return c.node(id).dir + ".disk"
	}
	return c.node(id).dir
}

func (c *Cluster) unmountLazy() {
	for id, l := range c.lazy {
		if err := l.Unmount(); err != nil {
			c.log("unmount the lazy file system of %s: %v", id, err)
		}
	}
}

// Wipe empties node id's data directory (a mount point stays).
func (c *Cluster) Wipe(id string) error {
	dir := c.node(id).dir
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// NewCluster plans n nodes under root with their proxies; Start starts them.
func NewCluster(bin, root string, n int, logf func(string, ...any)) (*Cluster, error) {
	c := &Cluster{bin: bin, root: root, conn: map[string]*grpc.ClientConn{}, log: logf}
	c.net = NewNet(c.owner)
	for i := 1; i <= n; i++ {
		nd := &node{id: fmt.Sprint("n", i)}
		nd.dir = filepath.Join(root, nd.id)
		nd.logPath = filepath.Join(root, nd.id+".log")
		var err error
		if nd.grpc, err = loopback.StableAddr(); err != nil {
			return nil, err
		}
		if nd.raft, err = loopback.StableAddr(); err != nil {
			return nil, err
		}
		cc, err := grpc.NewClient(nd.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, err
		}
		c.conn[nd.id] = cc
		c.nodes = append(c.nodes, nd)
	}
	// The proxies accept (and ask owner, which reads c.nodes) only once
	// every node is planned.
	for _, nd := range c.nodes {
		var err error
		if nd.proxy, err = c.net.Listen(nd.id, nd.raft); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// owner names the node process that dialed a proxied connection.
func (c *Cluster) owner(local, remote net.Addr) string {
	pids := map[int]string{}
	for _, n := range c.nodes {
		n.mu.Lock()
		if n.cmd != nil && n.cmd.Process != nil {
			pids[n.cmd.Process.Pid] = n.id
		}
		n.mu.Unlock()
	}
	id, err := connOwner(pids, local, remote)
	if err != nil {
		return anyNode
	}
	return id
}

// IDs are the node IDs, n1 first.
func (c *Cluster) IDs() []string {
	var ids []string
	for _, n := range c.nodes {
		ids = append(ids, n.id)
	}
	return ids
}

// Addrs are the nodes' gRPC addresses.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.grpc)
	}
	return out
}

func (c *Cluster) node(id string) *node {
	for _, n := range c.nodes {
		if n.id == id {
			return n
		}
	}
	panic("chaos: no node " + id)
}

func (c *Cluster) peers() string {
	var pl []string
	for _, n := range c.nodes {
		pl = append(pl, n.id+"="+n.proxy.Addr())
	}
	return strings.Join(pl, ",")
}

// StartAll starts every node with the static membership.
func (c *Cluster) StartAll() error {
	for _, n := range c.nodes {
		if err := c.Start(n.id, nil); err != nil {
			return err
		}
	}
	return nil
}

// Start starts node id: with --peers, or with join (gRPC addresses of
// members) to join the cluster as a new member.
func (c *Cluster) Start(id string, join []string) error {
	n := c.node(id)
	if err := os.MkdirAll(n.dir, 0o755); err != nil {
		return err
	}
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	args := []string{"--data", n.dir, "--node-id", n.id, "--listen", n.grpc,
		"--raft-listen", n.raft, "--raft-advertise", n.proxy.Addr()}
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	} else {
		args = append(args, "--peers", c.peers())
	}
	if c.bootID != "" {
		args = append(args, "--boot-id-file", c.bootID)
	}
	args = append(args, n.extra...)
	cmd := exec.Command(c.bin, append(args, brokerFlags...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C on the chaos run reaches the
	// brokers only through the chaos process, which stops them by PID.
	// Pdeathsig: should the chaos process die without stopping them (a
	// crash), the kernel kills them rather than leaving orphans.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(logf, "==== chaos: %s start %s\n", time.Now().UTC().Format(time.RFC3339Nano), strings.Join(args, " "))
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", id, err)
	}
	done := make(chan struct{})
	go func() {
		// Every exit is written down, the harness's own stops too: a node
		// found not running later was one that ended by itself.
		err := cmd.Wait()
		fmt.Fprintf(logf, "==== chaos: %s %s exited: %v\n", time.Now().UTC().Format(time.RFC3339Nano), id, exitText(err))
		logf.Close()
		c.log("%s exited: %v", id, exitText(err))
		close(done)
	}()
	n.mu.Lock()
	n.cmd, n.done, n.paused = cmd, done, false
	n.mu.Unlock()
	return nil
}

// exitText is how a process's end reads in the logs.
func exitText(err error) string {
	if err == nil {
		return "status 0"
	}
	return err.Error()
}

// Running reports whether node id's process is running.
func (c *Cluster) Running(id string) bool {
	n := c.node(id)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.done == nil {
		return false
	}
	select {
	case <-n.done:
		return false
	default:
		return true
	}
}

// Exited waits up to d for node id's process to exit by itself and
// reports whether it did.
func (c *Cluster) Exited(id string, d time.Duration) bool {
	n := c.node(id)
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return true
	}
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// Kill sends SIGKILL to node id (a crash) and waits for it to exit.
func (c *Cluster) Kill(id string) { c.stop(id, syscall.SIGKILL, 0) }

// Stop sends SIGTERM to node id and waits up to 20 s before SIGKILL.
func (c *Cluster) Stop(id string) { c.stop(id, syscall.SIGTERM, 20*time.Second) }

func (c *Cluster) stop(id string, sig syscall.Signal, grace time.Duration) {
	n := c.node(id)
	n.mu.Lock()
	cmd, done, paused := n.cmd, n.done, n.paused
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	if paused {
		_ = cmd.Process.Signal(syscall.SIGCONT)
	}
	if grace > 0 {
		select {
		case <-done:
			return
		case <-time.After(grace):
			c.log("%s did not stop within %v of %v; killing it", id, grace, sig)
			_ = cmd.Process.Kill()
		}
	}
	<-done
}

// Pause stops node id's process (SIGSTOP); Resume continues it.
func (c *Cluster) Pause(id string)  { c.signal(id, syscall.SIGSTOP, true) }
func (c *Cluster) Resume(id string) { c.signal(id, syscall.SIGCONT, false) }

func (c *Cluster) signal(id string, sig syscall.Signal, paused bool) {
	n := c.node(id)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil && n.cmd.ProcessState == nil {
		_ = n.cmd.Process.Signal(sig)
		n.paused = paused
	}
}

// Close stops every node and the network, and closes the connections.
func (c *Cluster) Close() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(func() { c.Stop(n.id) })
	}
	wg.Wait()
	c.unmountLazy()
	c.net.Close()
	for _, cc := range c.conn {
		cc.Close()
	}
}

// Admin is the admin API of node id.
func (c *Cluster) Admin(id string) txmqv1.AdminServiceClient {
	return txmqv1.NewAdminServiceClient(c.conn[id])
}

// Status asks node id for its own view of the cluster.
func (c *Cluster) Status(ctx context.Context, id string, local bool) (*txmqv1.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.Admin(id).ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{Local: local})
}

// Leader is the node the running nodes agree leads, if any.
func (c *Cluster) Leader(ctx context.Context) (string, error) {
	var errs []error
	for _, n := range c.nodes {
		if !c.Running(n.id) || c.isPaused(n.id) {
			continue
		}
		st, err := c.Status(ctx, n.id, true)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st.GetState() == "LEADER" {
			return n.id, nil
		}
	}
	if len(errs) == 0 {
		return "", errors.New("no leader: no running node says it leads")
	}
	return "", fmt.Errorf("no leader: %w", errors.Join(errs...))
}

// WaitLeader polls until a node leads, up to d.
func (c *Cluster) WaitLeader(ctx context.Context, d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	for {
		id, err := c.Leader(ctx)
		if err == nil || time.Now().After(deadline) {
			return id, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (c *Cluster) isPaused(id string) bool {
	n := c.node(id)
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.paused
}
