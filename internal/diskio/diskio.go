// Package diskio holds the file-system steps that txmq's durability rests
// on, shared by the state machine's store (halfstore) and the Raft log
// (raftlog/wal), so that each is written once.
package diskio

import "os"

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
