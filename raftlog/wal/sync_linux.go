package wal

import (
	"os"
	"syscall"
)

// datasync makes f's written data durable without its metadata's times
// (fdatasync): with the segment preallocated, a write changes no size.
func datasync(f *os.File) error {
	return syscall.Fdatasync(int(f.Fd()))
}

// preallocate reserves size bytes for f, so that appends within it do not
// grow the file. A file system that cannot (some FUSE ones) gets a file that
// grows as it is written, which is still correct, only slower to sync.
func preallocate(f *os.File, size int64) {
	_ = syscall.Fallocate(int(f.Fd()), 0, 0, size)
}
