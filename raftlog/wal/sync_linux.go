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
// grow the file. A file system that cannot (some FUSE ones) gets a sparse
// file of that size, which is still correct, only slower to sync. Either
// way the file has its full size before any record is written, so a record
// that runs past the end of the file is a file cut short, never a torn
// write (segment.scan).
func preallocate(f *os.File, size int64) error {
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err == nil {
		return nil
	}
	return f.Truncate(size)
}
