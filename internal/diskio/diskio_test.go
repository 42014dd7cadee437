package diskio

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

func TestSyncDir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SyncDir(dir); err != nil {
		t.Fatalf("sync %s: %v", dir, err)
	}
	if err := SyncDir(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Fatalf("sync of a missing directory: %v, want not exist", err)
	}
}

func TestWriteFailed(t *testing.T) {
	full := WriteFailed("wal: write x", &os.PathError{Op: "write", Path: "x", Err: syscall.ENOSPC})
	if !errors.Is(full, ErrWrite) || !errors.Is(full, syscall.ENOSPC) {
		t.Fatalf("%v: want ErrWrite and ENOSPC", full)
	}
	if got := Describe(full); got != "has a full disk" {
		t.Fatalf("Describe(%v) = %q", full, got)
	}
	// bbolt passes a failed resize on as text.
	text := WriteFailed("commit", fmt.Errorf("file resize error: %s", syscall.ENOSPC))
	if got := Describe(text); got != "has a full disk" {
		t.Fatalf("Describe(%v) = %q", text, got)
	}
	eio := WriteFailed("commit", syscall.EIO)
	if got := Describe(eio); got != "cannot write to its disk" {
		t.Fatalf("Describe(%v) = %q", eio, got)
	}
}
