//go:build !linux

package wal

import "os"

func datasync(f *os.File) error { return f.Sync() }

// preallocate gives f its size before any record is written (see
// sync_linux.go).
func preallocate(f *os.File, size int64) error { return f.Truncate(size) }
