package lazyfs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func mount(t *testing.T, cfg Config) (*FS, string) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	backing, mnt := t.TempDir(), t.TempDir()
	l, err := Mount(backing, mnt, cfg)
	if err != nil {
		t.Skip("cannot mount FUSE here (root and /dev/fuse are needed):", err)
	}
	t.Cleanup(func() { l.Unmount() })
	return l, mnt
}

func write(t *testing.T, p string, off int64, s string, sync bool) {
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte(s), off)
	require.NoError(t, err)
	if sync {
		require.NoError(t, f.Sync())
	}
	require.NoError(t, f.Close())
}

// cut drops the unsynced writes and remounts, as the chaos run does.
func cut(t *testing.T, l *FS) {
	_, _, err := l.Cut()
	require.NoError(t, err)
	require.NoError(t, l.Unmount())
	require.NoError(t, l.Remount())
}

func read(t *testing.T, p string) string {
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return string(b)
}

func TestCutDropsWhatWasNotSynced(t *testing.T) {
	l, mnt := mount(t, Config{})
	synced, never := filepath.Join(mnt, "synced"), filepath.Join(mnt, "never")
	write(t, synced, 0, "hello world", true)
	write(t, synced, 0, "HELLO", false)       // overwrites synced bytes
	write(t, synced, 11, ", and more", false) // grows the file
	write(t, never, 0, "never synced", false)
	require.Equal(t, "HELLO world, and more", read(t, synced), "reads see unsynced writes")
	require.Equal(t, 2, l.Pending())

	cut(t, l)
	require.Equal(t, "hello world", read(t, synced))
	require.Equal(t, "", read(t, never), "a file never synced is empty after a cut")

	// What was synced after the cut survives the next one.
	write(t, synced, 6, "there", true)
	write(t, synced, 0, "xxxxx", false)
	require.NoError(t, os.Truncate(synced, 3))
	cut(t, l)
	require.Equal(t, "hello there", read(t, synced))
}

func TestLyingSyncLosesWhatItAcknowledged(t *testing.T) {
	l, mnt := mount(t, Config{LyingSync: ".wal", Window: time.Hour})
	wal, db := filepath.Join(mnt, "1.wal"), filepath.Join(mnt, "fsm.db")
	write(t, wal, 0, "record one", true)
	write(t, db, 0, "state", true)
	cut(t, l)
	require.Equal(t, "", read(t, wal), "a lying sync made nothing durable within the window")
	require.Equal(t, "state", read(t, db), "other files' syncs are honest")
}

func TestSlowSync(t *testing.T) {
	_, mnt := mount(t, Config{SyncDelay: func() time.Duration { return 100 * time.Millisecond }})
	start := time.Now()
	write(t, filepath.Join(mnt, "f"), 0, "x", true)
	require.GreaterOrEqual(t, time.Since(start), 100*time.Millisecond)
}

func TestFull(t *testing.T) {
	l, mnt := mount(t, Config{})
	p := filepath.Join(mnt, "f")
	write(t, p, 0, "before", true)
	l.SetFull(true)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("during"), 0)
	require.ErrorIs(t, err, syscall.ENOSPC)
	require.NoError(t, f.Close())
	l.SetFull(false)
	write(t, p, 0, "after!", true)
	require.Equal(t, "after!", read(t, p))
}

func TestCutReachesSubdirectories(t *testing.T) {
	l, mnt := mount(t, Config{})
	dir := filepath.Join(mnt, "raft-wal", "deeper")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	p := filepath.Join(dir, "1.wal")
	write(t, p, 0, "synced", true)
	write(t, p, 6, " and not", false)
	cut(t, l)
	require.Equal(t, "synced", read(t, p))
}

// Files opened write-only, and truncated by path, are undone too.
func TestCutUndoesWriteOnlyAndTruncateByPath(t *testing.T) {
	l, mnt := mount(t, Config{})
	p := filepath.Join(mnt, "f")
	write(t, p, 0, "0123456789", true)
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("abc"), 0)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, os.Truncate(p, 5))
	require.Equal(t, "abc34", read(t, p))
	cut(t, l)
	require.Equal(t, "0123456789", read(t, p))
}

// A page written through the mount is what a reader mapping the file sees
// once write() returned, even while the file is opened again meanwhile
// (the kernel dropped its cached pages at every open, and a page fault
// could read a page here before an in-flight write of it landed: bbolt,
// reading its tree through mmap, then read stale pages and panicked).
func TestMappedPagesAreFreshWhileOpened(t *testing.T) {
	_, mnt := mount(t, Config{})
	// The mapping is read by another process: page faults served by this
	// one while it is stopped for its garbage collector would deadlock.
	cmd := exec.Command(os.Args[0], "-test.run=^TestMappedPagesChild$")
	cmd.Env = append(os.Environ(), "LAZYFS_MMAP_FILE="+filepath.Join(mnt, "f"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "fresh after")
}

// TestMappedPagesChild is TestMappedPagesAreFreshWhileOpened's other
// process: it writes pages for 3 s, opening the file again all along, and
// fails on the first page its mapping shows stale after its write,
// while another goroutine reads every page through the mapping.
func TestMappedPagesChild(t *testing.T) {
	p := os.Getenv("LAZYFS_MMAP_FILE")
	if p == "" {
		t.Skip("run by TestMappedPagesAreFreshWhileOpened")
	}
	const page, pages = 4096, 64
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(page*pages))
	m, err := syscall.Mmap(int(f.Fd()), 0, page*pages, syscall.PROT_READ, syscall.MAP_SHARED)
	require.NoError(t, err)
	defer syscall.Munmap(m)
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(done)
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if g, err := os.Open(p); err == nil {
					g.Close()
				}
			}
		})
	}
	// Touching every page makes the kernel read the dropped ones again.
	var touched atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			for k := range pages {
				touched.Add(int64(m[k*page]))
			}
		}
	})
	deadline := time.Now().Add(3 * time.Second)
	i := 0
	for ; time.Now().Before(deadline); i++ {
		k := i % pages
		data := bytes.Repeat(fmt.Appendf(nil, "%08d", i), page/8)
		_, err := f.WriteAt(data, int64(k*page))
		require.NoError(t, err)
		require.True(t, bytes.Equal(m[k*page:(k+1)*page], data), "write %d: page %d read through mmap is stale after write() returned", i, k)
	}
	fmt.Printf("fresh after %d writes\n", i)
}
