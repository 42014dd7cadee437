package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Every txmq write crosses between processes four times on its way
// (client → leader → follower → leader → client), and every crossing is a
// wake-up of another process. measureRoundTrip times a round trip of a
// small message between this process and a child over loopback TCP, before
// the brokers start: two crossings with nothing else in them, the
// machine's floor under those hops, as measureFsync is under the disk's.
// It times them back to back and after a pause: a process that waited for
// a while (as the brokers do between the writes of one producer, during an
// fsync) takes longer to wake than one that was just running.

// echoEnv, set, makes the binary the child of measureRoundTrip (echo)
// instead of the bench.
const echoEnv = "TXMQ_BENCH_ECHO"

// pingSize is the size of one message of the round trip, about that of a
// small request's frame.
const pingSize = 64

// echo is the child: it listens on a free loopback port, prints its
// address, and sends back every message of the one connection it accepts
// until that connection closes.
func echo(stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(stderr, "echo: %v\n", err)
		return 1
	}
	defer ln.Close()
	fmt.Fprintln(stdout, ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		fmt.Fprintf(stderr, "echo: %v\n", err)
		return 1
	}
	defer c.Close()
	buf := make([]byte, pingSize)
	for {
		if _, err := io.ReadFull(c, buf); err != nil {
			return 0
		}
		if _, err := c.Write(buf); err != nil {
			fmt.Fprintf(stderr, "echo: %v\n", err)
			return 1
		}
	}
}

// roundTripPause is the pause before each idle round trip.
const roundTripPause = 200 * time.Microsecond

// measureRoundTrip starts the echo child, times n round trips to it back
// to back (after a few that warm the connection up) and n after a pause
// each (idle), and stops the child by its PID.
func measureRoundTrip(n int) (hot, idle summary, err error) {
	exe, err := os.Executable()
	if err != nil {
		return hot, idle, fmt.Errorf("round trip probe: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), echoEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return hot, idle, fmt.Errorf("round trip probe: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return hot, idle, fmt.Errorf("round trip probe: %w", err)
	}
	var c net.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
		stopChild(cmd)
	}()
	addr := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		addr <- strings.TrimSpace(line)
	}()
	select {
	case a := <-addr:
		c, err = net.DialTimeout("tcp", a, 5*time.Second)
	case <-time.After(10 * time.Second):
		err = fmt.Errorf("the echo process gave no address within 10 s")
	}
	if err != nil {
		return hot, idle, fmt.Errorf("round trip probe: %w", err)
	}
	if err := c.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		return hot, idle, fmt.Errorf("round trip probe: %w", err)
	}
	buf := make([]byte, pingSize)
	var hh, ih hist
	const warm = 20
	for i := range warm + 2*n {
		if i >= warm+n {
			time.Sleep(roundTripPause)
		}
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			return hot, idle, fmt.Errorf("round trip probe: %w", err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return hot, idle, fmt.Errorf("round trip probe: %w", err)
		}
		switch {
		case i >= warm+n:
			ih.add(time.Since(t0))
		case i >= warm:
			hh.add(time.Since(t0))
		}
	}
	return hh.summary(), ih.summary(), nil
}

// stopChild waits for the child, which ends when its connection closes,
// and kills it by its PID if it has not within 5 s.
func stopChild(cmd *exec.Cmd) {
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}
