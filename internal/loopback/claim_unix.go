//go:build unix

package loopback

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// claim reports whether no other process has handed out port: it takes an
// exclusive lock on a file named after the port in the system's temporary
// folder and keeps the file open, so the lock lasts as long as this process
// and goes with it, however it ends. Where the file cannot be made, the
// port is claimed without it (the process's own record still holds).
// Called with handed's lock held, which also guards claimed.
func claim(port int) bool {
	dir := filepath.Join(os.TempDir(), "txmq-stable-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return true
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return false
	}
	claimed = append(claimed, f)
	return true
}

// claimed are the locked files, open until the process ends.
var claimed []*os.File
