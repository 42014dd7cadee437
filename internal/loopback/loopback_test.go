package loopback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:7420": true, "127.9.9.9:1": true, "[::1]:7420": true, "::1": true,
		"localhost:7420": true, "LOCALHOST": true, "localhost.": true, "api.localhost:80": true,
		"0.0.0.0:7420": false, ":7420": false, "10.0.0.1:7420": false, "example.com:443": false,
		"localhost.example.com": false, "": false,
	} {
		if got := Addr(addr); got != want {
			t.Errorf("Addr(%q) = %t, want %t", addr, got, want)
		}
	}
}

func TestStableAddr(t *testing.T) {
	addr, err := StableAddr()
	if err != nil {
		t.Fatal(err)
	}
	if !Addr(addr) {
		t.Fatalf("StableAddr %q is not on loopback", addr)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on StableAddr %q: %v", addr, err)
	}
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	if p, _ := strconv.Atoi(port); p < 1024 || p >= 61000 {
		t.Fatalf("StableAddr port %d out of range", p)
	}
}

// Callers pick several addresses before anything listens on them, so
// StableAddr never returns a port twice in a process: 500 picks from its
// 10,000 ports would repeat about 12 by chance alone.
func TestStableAddrNeverTwice(t *testing.T) {
	seen := map[string]bool{}
	for range 500 {
		addr, err := StableAddr()
		if err != nil {
			t.Fatal(err)
		}
		if seen[addr] {
			t.Fatalf("StableAddr returned %s twice", addr)
		}
		seen[addr] = true
	}
}

// Nor in two processes picking at once: the test's binary, started again,
// picks 300 addresses while this process holds 300 it picked and nothing
// listens on; by chance alone about 9 would be the same.
func TestStableAddrAcrossProcesses(t *testing.T) {
	const picks = 300
	pick := func() []string {
		var addrs []string
		for range picks {
			addr, err := StableAddr()
			if err != nil {
				t.Fatal(err)
			}
			addrs = append(addrs, addr)
		}
		return addrs
	}
	if os.Getenv("TXMQ_LOOPBACK_PICKER") != "" {
		fmt.Println(strings.Join(pick(), "\n"))
		return
	}
	if runtime.GOOS == "windows" {
		t.Skip("no file locks between processes here")
	}
	mine := map[string]bool{}
	for _, addr := range pick() {
		mine[addr] = true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStableAddrAcrossProcesses$")
	cmd.Env = append(os.Environ(), "TXMQ_LOOPBACK_PICKER=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the other process: %v", err)
	}
	var theirs int
	for _, line := range strings.Fields(string(out)) {
		if _, _, err := net.SplitHostPort(line); err != nil {
			continue
		}
		theirs++
		if mine[line] {
			t.Errorf("both processes were handed %s", line)
		}
	}
	if theirs != picks {
		t.Fatalf("the other process printed %d addresses, want %d:\n%s", theirs, picks, out)
	}
}

// ListenAgain waits for a taken port to be let go, and gives up with the
// error after its wait.
func TestListenAgain(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := held.Addr().String()
	if _, err := ListenAgain(addr, 50*time.Millisecond); !errors.Is(err, syscall.EADDRINUSE) {
		held.Close()
		t.Fatalf("ListenAgain on a port still taken: %v, want address already in use", err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		held.Close()
	}()
	l, err := ListenAgain(addr, 10*time.Second)
	if err != nil {
		t.Fatalf("ListenAgain after the port was let go: %v", err)
	}
	l.Close()
}
