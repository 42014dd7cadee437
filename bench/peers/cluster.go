package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// natsCluster is three NATS server processes on loopback: this binary,
// re-executed with "serve".
type natsCluster struct {
	urls  []string
	procs []*exec.Cmd
	done  []chan struct{} // closed when the process has ended
	logs  []string        // where each one's output goes
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
		if err := c.start(cmd, filepath.Join(dir, name+".log")); err != nil {
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

// start runs cmd, its output going to a new file at log, and watches for
// its end.
func (c *natsCluster) start(cmd *exec.Cmd, log string) error {
	logf, err := os.Create(log)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	c.procs = append(c.procs, cmd)
	c.done = append(c.done, done)
	c.logs = append(c.logs, log)
	return nil
}

// ended names the servers that stopped by themselves: a stream of three
// replicas goes on with two, so figures taken then would be a smaller
// cluster's.
func (c *natsCluster) ended() error {
	var errs []error
	for i, done := range c.done {
		select {
		case <-done:
			errs = append(errs, fmt.Errorf("nats server n%d ended by itself (%s): its log is %s", i+1, c.procs[i].ProcessState, c.logs[i]))
		default:
		}
	}
	return errors.Join(errs...)
}

// close stops the servers by their PIDs: SIGTERM, then SIGKILL after 15 s.
func (c *natsCluster) close() error {
	var errs []error
	for _, p := range c.procs {
		if err := p.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, err)
		}
	}
	for i, p := range c.procs {
		select {
		case <-c.done[i]:
		case <-time.After(15 * time.Second):
			_ = p.Process.Kill()
			<-c.done[i]
			errs = append(errs, fmt.Errorf("nats server %d did not stop within 15s of SIGTERM; killed", i+1))
		}
	}
	return errors.Join(errs...)
}

// usage is the servers' CPU time so far and their largest peak RSS, from
// /proc (times in USER_HZ, 100 on Linux).
func (c *natsCluster) usage() (time.Duration, uint64, bool) {
	var cpu time.Duration
	var peak uint64
	for _, p := range c.procs {
		pid := p.Process.Pid
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, 0, false
		}
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		utime, _ := strconv.ParseUint(f[11], 10, 64)
		stime, _ := strconv.ParseUint(f[12], 10, 64)
		cpu += time.Duration(utime+stime) * time.Second / 100
		hwm, ok := vmHWM(pid)
		if !ok {
			return 0, 0, false
		}
		peak = max(peak, hwm)
	}
	return cpu, peak, true
}

func vmHWM(pid int) (uint64, bool) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err == nil
		}
	}
	return 0, false
}
