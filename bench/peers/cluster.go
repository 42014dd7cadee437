package main

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/txmq/txmq/internal/procs"
)

// natsCluster is three NATS server processes on loopback: this binary,
// re-executed with "serve".
type natsCluster struct {
	urls  []string
	procs procs.Group
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startNATS(dir string, always bool) (*natsCluster, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	const n = 3
	var ports, cports [n]int
	for i := range n {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
		if cports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	c := &natsCluster{}
	for i := range n {
		var routes []string
		for j := range n {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", cports[j]))
			}
		}
		name := fmt.Sprint("n", i+1)
		store := filepath.Join(dir, name)
		if err := os.MkdirAll(store, 0o700); err != nil {
			c.close()
			return nil, err
		}
		cmd := exec.Command(self, "serve", "--name", name, "--port", strconv.Itoa(ports[i]), "--cluster-port", strconv.Itoa(cports[i]),
			"--routes", strings.Join(routes, ","), "--store", store, "--sync-always="+strconv.FormatBool(always))
		if err := c.procs.Start("nats server "+name, cmd, filepath.Join(dir, name+".log")); err != nil {
			c.close()
			return nil, err
		}
		c.urls = append(c.urls, fmt.Sprintf("nats://127.0.0.1:%d", ports[i]))
	}
	for _, p := range ports {
		if err := waitListening(fmt.Sprintf("127.0.0.1:%d", p), 30*time.Second); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func waitListening(addr string, total time.Duration) error {
	deadline := time.Now().Add(total)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			return conn.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats server on %s not listening within %s: %w", addr, total, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ended names the servers that stopped by themselves: a stream of three
// replicas goes on with two, so figures taken then would be a smaller
// cluster's.
func (c *natsCluster) ended() error { return c.procs.Ended() }

// close stops the servers by their PIDs: SIGTERM, then SIGKILL after 15 s.
func (c *natsCluster) close() error { return c.procs.Stop() }

// usage is the servers' CPU time so far and their largest peak RSS, from
// /proc (times in USER_HZ, 100 on Linux).
func (c *natsCluster) usage() (time.Duration, uint64, bool) { return c.procs.Usage() }
