package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// socketInode finds, in /proc/net/tcp, the inode of the socket whose local
// end is local and whose remote end is remote: the dialer's side of a
// connection a proxy accepted (its local is the proxy's remote).
func socketInode(local, remote *net.TCPAddr) (string, error) {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return "", err
	}
	defer f.Close()
	want := hexAddr(local) + " " + hexAddr(remote)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		if fields[1]+" "+fields[2] == want {
			return fields[9], nil
		}
	}
	return "", fmt.Errorf("%w: no socket %s", errUnknownOwner, want)
}

// hexAddr writes an IPv4 address as /proc/net/tcp does: the address as a
// little-endian 32-bit hex number, a colon, the port in hex.
func hexAddr(a *net.TCPAddr) string {
	ip := a.IP.To4()
	if ip == nil {
		return ""
	}
	return fmt.Sprintf("%02X%02X%02X%02X:%04X", ip[3], ip[2], ip[1], ip[0], a.Port)
}

// holdsSocket reports whether process pid has the socket inode open.
func holdsSocket(pid int, inode string) bool {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	want := "socket:[" + inode + "]"
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && l == want {
			return true
		}
	}
	return false
}

// connOwner names which of pids (node ID by PID) dialed the connection
// that a proxy accepted with these local and remote addresses.
func connOwner(pids map[int]string, local, remote net.Addr) (string, error) {
	l, ok1 := local.(*net.TCPAddr)
	r, ok2 := remote.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return "", errUnknownOwner
	}
	inode, err := socketInode(r, l)
	if err != nil {
		return "", err
	}
	for pid, id := range pids {
		if holdsSocket(pid, inode) {
			return id, nil
		}
	}
	return "", fmt.Errorf("%w: socket inode %s", errUnknownOwner, inode)
}
