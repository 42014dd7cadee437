// Package diskio holds the file-system steps that txmq's durability rests
// on, shared by the state machine's store (halfstore) and the Raft log
// (raftlog/wal), so that each is written once.
package diskio

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// ErrWrite is matched (errors.Is) by every error of a write or sync of
// the node's data that the disk refused: full (ENOSPC), over a quota,
// read-only, failing. The node takes no writes until one succeeds again;
// nothing it acknowledged is lost.
var ErrWrite = errors.New("the disk refused a write")

// WriteFailed wraps err, a failed write or sync of what, so that it
// matches ErrWrite (and still its cause, such as syscall.ENOSPC).
func WriteFailed(what string, err error) error {
	return fmt.Errorf("%s: %w: %w", what, ErrWrite, err)
}

// Describe says what the disk did in err, a write failure: "has a full
// disk" when it was full (bbolt passes some errors on as text only, hence
// the look at the text), else "cannot write to its disk".
func Describe(err error) string {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || strings.Contains(err.Error(), syscall.ENOSPC.Error()) {
		return "has a full disk"
	}
	return "cannot write to its disk"
}

// SyncDir fsyncs the directory dir, making the names created, renamed or
// removed in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
