// Package procs runs the server processes of the benches (txmq-bench's
// brokers, bench/peers' NATS servers): each one's output goes to a log
// file, an end nobody asked for is reported with its exit status and log
// (a cluster of three goes on with two, and its figures would then be a
// smaller cluster's, silently), they are stopped by their PIDs, and their
// CPU time and peak RSS are read from /proc.
package procs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
const StopGrace = 15 * time.Second

// A Group is the processes started through it.
type Group struct {
	procs []*proc
}

type proc struct {
	name string // in messages: "broker n2", "nats server n1"
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has ended
}

// Start runs cmd, named name in messages, its output going to a new file
// at log, and watches for its end.
func (g *Group) Start(name string, cmd *exec.Cmd, log string) error {
	logf, err := os.Create(log)
	if err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	g.procs = append(g.procs, p)
	return nil
}

// Len is how many processes were started.
func (g *Group) Len() int { return len(g.procs) }

// Ended names the processes that have ended by themselves, with their exit
// status and log; nil while all run.
func (g *Group) Ended() error {
	var errs []error
	for _, p := range g.procs {
		select {
		case <-p.done:
			errs = append(errs, fmt.Errorf("%s ended by itself (%s): its log is %s", p.name, p.cmd.ProcessState, p.log))
		default:
		}
	}
	return errors.Join(errs...)
}

// Stop stops every process by its PID: SIGTERM, then SIGKILL after
// StopGrace.
func (g *Group) Stop() error {
	var errs []error
	for _, p := range g.procs {
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			errs = append(errs, err)
		}
	}
	for _, p := range g.procs {
		select {
		case <-p.done:
		case <-time.After(StopGrace):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("%s did not stop within %s of SIGTERM; killed", p.name, StopGrace))
		}
	}
	return errors.Join(errs...)
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTick = 100

// Usage is the processes' CPU time so far, summed, and the largest peak
// RSS among them; false where /proc cannot tell (a process has ended, or
// there is no /proc).
func (g *Group) Usage() (cpu time.Duration, peak uint64, ok bool) {
	for _, p := range g.procs {
		pid := p.cmd.Process.Pid
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return 0, 0, false
		}
		// Fields after the command name, which is in parentheses.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		utime, _ := strconv.ParseUint(f[11], 10, 64)
		stime, _ := strconv.ParseUint(f[12], 10, 64)
		cpu += time.Duration(utime+stime) * time.Second / clockTick
		hwm, ok := vmHWM(pid)
		if !ok {
			return 0, 0, false
		}
		peak = max(peak, hwm)
	}
	return cpu, peak, true
}

// vmHWM is a process's peak RSS in bytes, from /proc/<pid>/status.
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

// Machine is what /proc/stat counts for the whole machine since it booted:
// its context switches, and the time its CPUs were busy (everything but
// idle and iowait; the kernel's work and other processes' count too).
// Taken before and after a window, it tells what a run cost the machine
// beside what it cost the servers (Usage).
type Machine struct {
	Switches uint64
	Busy     time.Duration
}

// ReadMachine reads /proc/stat; false where there is none, or it does not
// hold both counts.
func ReadMachine() (Machine, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Machine{}, false
	}
	return parseStat(string(b))
}

// Sub is what m counted since m0.
func (m Machine) Sub(m0 Machine) Machine {
	return Machine{Switches: m.Switches - m0.Switches, Busy: m.Busy - m0.Busy}
}

// parseStat reads the ctxt line and the all-CPUs line of /proc/stat: user,
// nice, system, idle, iowait, irq, softirq, steal, in USER_HZ (guest time
// is within user and nice already).
func parseStat(s string) (Machine, bool) {
	var m Machine
	var haveCtxt, haveCPU bool
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && f[0] == "ctxt":
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return Machine{}, false
			}
			m.Switches, haveCtxt = n, true
		case len(f) >= 9 && f[0] == "cpu":
			var busy uint64
			for i, v := range f[1:9] {
				n, err := strconv.ParseUint(v, 10, 64)
				if err != nil {
					return Machine{}, false
				}
				if i != 3 && i != 4 { // idle, iowait
					busy += n
				}
			}
			m.Busy, haveCPU = time.Duration(busy)*time.Second/clockTick, true
		}
	}
	return m, haveCtxt && haveCPU
}
