// Package lazyfs is a FUSE passthrough file system that can lose what was
// never synced, as a power cut does: it forwards every operation to a
// backing directory, and remembers, per file, what each write since the
// file's last fsync (or fdatasync) overwrote and the size the file had
// then. Cut puts those bytes back and the sizes too, leaving every file as
// its last sync left it. It is LazyFS's idea (the page cache held in
// memory and dropped on a "crash") done the other way round: writes reach
// the backing file at once and a cut undoes them, so reads need no
// overlay.
//
// What it models: data written but not synced is lost, for every file, all
// at once. What it does not: metadata (creates, renames, unlinks and
// directory fsyncs are durable at once), torn writes (a cut drops all of
// the unsynced writes of a file or none of them), and the device's own
// cache. An fsync here does not reach the backing disk: only a cut decides
// what survives.
package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Config says how a mount behaves.
type Config struct {
	// SyncDelay, when set, is how long each fsync waits (a slow disk).
	SyncDelay func() time.Duration
	// LyingSync names files (by suffix, e.g. ".wal") whose fsync returns
	// at once without making anything durable for Window: a cut also drops
	// what they synced in the last Window. A deliberately broken disk, to
	// show that a cut then loses acknowledged writes.
	LyingSync string
	Window    time.Duration
}

// FS is one mounted lazy file system.
type FS struct {
	cfg     Config
	backing string
	mnt     string
	server  *fuse.Server

	mu    sync.Mutex
	files map[uint64]*undo // by the backing file's inode
	full  bool             // writes fail with ENOSPC
}

// SetFull makes writes (and allocations) fail with ENOSPC, or work again.
func (l *FS) SetFull(full bool) {
	l.mu.Lock()
	l.full = full
	l.mu.Unlock()
}

// SetSyncDelay sets how long each fsync waits from now on (nil: none).
func (l *FS) SetSyncDelay(d func() time.Duration) {
	l.mu.Lock()
	l.cfg.SyncDelay = d
	l.mu.Unlock()
}

func (l *FS) syncDelay() time.Duration {
	l.mu.Lock()
	d := l.cfg.SyncDelay
	l.mu.Unlock()
	if d == nil {
		return 0
	}
	return d()
}

// save is what one write overwrote.
type save struct {
	off    int64
	old    []byte
	at     time.Time
	synced bool // an fsync after it returned (only kept for a lying sync)
}

// undo is what a cut must put back in one file.
type undo struct {
	f      *os.File // a descriptor of its own, valid after a rename or unlink
	name   string
	size   int64 // the size at the last sync
	saves  []save
	lying  bool
	resize []sizeAt // sizes before changes synced within the lying window
}

type sizeAt struct {
	size int64
	at   time.Time
}

// Available reports why FUSE cannot be used here, or nil.
func Available() error {
	f, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("lazyfs: no FUSE here: %w", err)
	}
	return f.Close()
}

// Mount mounts a lazy view of backing at mnt (both directories must exist).
func Mount(backing, mnt string, cfg Config) (*FS, error) {
	l := &FS{cfg: cfg, backing: backing, mnt: mnt, files: map[uint64]*undo{}}
	if err := l.mount(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *FS) mount() error {
	var st syscall.Stat_t
	if err := syscall.Stat(l.backing, &st); err != nil {
		return err
	}
	root := &fs.LoopbackRoot{Path: l.backing, Dev: st.Dev}
	rootNode := &node{LoopbackNode: &fs.LoopbackNode{RootData: root}, fs: l}
	root.RootNode = rootNode
	zero := time.Duration(0)
	server, err := fs.Mount(l.mnt, rootNode, &fs.Options{
		// ExplicitDataCacheControl: a changed mtime or size seen by a stat
		// must not make the kernel drop a file's cached pages (see
		// keepCache).
		MountOptions: fuse.MountOptions{DirectMountStrict: true, FsName: "lazyfs", Name: "lazyfs", DisableXAttrs: true,
			ExplicitDataCacheControl: true},
		// No kernel caching of names and attributes: a cut changes sizes
		// behind the kernel's back.
		EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero,
	})
	if err != nil {
		return fmt.Errorf("lazyfs: mount %s: %w", l.mnt, err)
	}
	l.server = server
	return nil
}

// Unmount unmounts the file system; nothing may have it open.
func (l *FS) Unmount() error {
	if l.server == nil {
		return nil
	}
	err := l.server.Unmount()
	l.server = nil
	return err
}

// Remount mounts it again after Unmount, with the same backing directory.
func (l *FS) Remount() error { return l.mount() }

// Cut drops every write not synced (and, for lying files, synced within
// the window) and returns how many files and bytes it put back. The
// processes using the mount must be dead: a cut under a running process
// is not a power cut. Unmount and Remount after it: the kernel still
// caches what the cut undid.
func (l *FS) Cut() (files int, bytes int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	cutoff := time.Now().Add(-l.cfg.Window)
	for ino, u := range l.files {
		n, size, e := u.rollback(cutoff)
		if e != nil {
			err = fmt.Errorf("lazyfs: cut %s: %w", u.name, e)
		}
		if n > 0 || size {
			files++
			bytes += n
		}
		u.f.Close()
		delete(l.files, ino)
	}
	return files, bytes, err
}

// rollback undoes u's writes, the newest first, down to what must
// survive: every write when it was never synced, else (a lying sync) those
// after cutoff.
func (u *undo) rollback(cutoff time.Time) (int64, bool, error) {
	var n int64
	i := len(u.saves)
	for i > 0 && (!u.saves[i-1].synced || u.saves[i-1].at.After(cutoff)) {
		i--
		s := u.saves[i]
		if _, err := u.f.WriteAt(s.old, s.off); err != nil {
			return n, false, err
		}
		n += int64(len(s.old))
	}
	size := u.size
	for _, r := range u.resize {
		if r.at.After(cutoff) {
			size = r.size
			break
		}
	}
	fi, err := u.f.Stat()
	if err != nil {
		return n, false, err
	}
	if fi.Size() == size {
		return n, false, nil
	}
	return n, true, u.f.Truncate(size)
}

// before records what a change of length n at off is about to overwrite,
// and the file's size, when this is its first change since its last sync.
func (l *FS) before(fd int, name string, off, n int64) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.full && n > 0 {
		return syscall.ENOSPC
	}
	u := l.files[st.Ino]
	if u == nil {
		// A descriptor of its own, for reading and writing whatever fd
		// was opened for (O_WRONLY, O_RDONLY for a truncate by path).
		f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", fd), os.O_RDWR, 0)
		if err != nil {
			return fs.ToErrno(err)
		}
		u = &undo{f: f, name: name, size: st.Size,
			lying: l.cfg.LyingSync != "" && len(name) >= len(l.cfg.LyingSync) && name[len(name)-len(l.cfg.LyingSync):] == l.cfg.LyingSync}
		l.files[st.Ino] = u
	}
	// Only what existed at the last sync needs saving: past that size a
	// cut truncates.
	end := min(off+n, u.syncedSize())
	if off < end {
		old := make([]byte, end-off)
		k, err := u.f.ReadAt(old, off)
		if err != nil && k < len(old) && !errors.Is(err, io.EOF) {
			return fs.ToErrno(err)
		}
		u.saves = append(u.saves, save{off: off, old: old[:k], at: time.Now()})
	}
	return 0
}

// syncedSize is the size a cut truncates to (lying: the oldest within the
// window, which rollback picks; here the largest, so that nothing a cut
// may restore goes unsaved).
func (u *undo) syncedSize() int64 {
	s := u.size
	for _, r := range u.resize {
		s = max(s, r.size)
	}
	return s
}

// synced marks the writes to fd's file durable.
func (l *FS) synced(fd int) syscall.Errno {
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		return fs.ToErrno(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.files[st.Ino]
	if u == nil {
		return 0
	}
	if !u.lying {
		u.f.Close()
		delete(l.files, st.Ino)
		return 0
	}
	now := time.Now()
	keep := u.saves[:0]
	for _, s := range u.saves {
		s.synced = true
		if now.Sub(s.at) < l.cfg.Window {
			keep = append(keep, s)
		}
	}
	u.saves = keep
	if st.Size != u.size {
		u.resize = append(u.resize, sizeAt{size: u.size, at: now})
		u.size = st.Size
	}
	return 0
}

// Pending is how many files have writes a cut would drop.
func (l *FS) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.files)
}

// node is a loopback node whose files are lazy.
type node struct {
	*fs.LoopbackNode
	fs *FS
}

var (
	_ fs.NodeOpener      = (*node)(nil)
	_ fs.NodeCreater     = (*node)(nil)
	_ fs.NodeSetattrer   = (*node)(nil)
	_ fs.NodeWrapChilder = (*node)(nil)
)

// WrapChild makes every node below the root lazy too.
func (n *node) WrapChild(_ context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	if lb, ok := ops.(*fs.LoopbackNode); ok {
		return &node{LoopbackNode: lb, fs: n.fs}
	}
	return ops
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, fl, errno := n.LoopbackNode.Open(ctx, flags)
	if errno != 0 {
		return nil, 0, errno
	}
	return n.wrap(fh, n.Path(nil)), fl | keepCache, 0
}

// keepCache keeps the kernel's cached pages of a file when it is opened
// again. Dropping them (at an open, or a stat seeing a new mtime) while a
// write of the same file is in flight lets a page fault read the page
// from here before the write lands: the cache then holds the old bytes
// after write() returned, and a process reading the file through mmap
// (bbolt) reads a stale page, as no disk would show it. Every write goes
// through the kernel's cache (write-through), so it never needs dropping;
// only a cut changes files behind it, and the file system is remounted
// after one.
const keepCache = fuse.FOPEN_KEEP_CACHE

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	in, fh, fl, errno := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if errno != 0 {
		return nil, nil, 0, errno
	}
	f := n.wrap(fh, n.Path(nil)+"/"+name)
	// A new file: a cut before its first sync leaves it empty.
	if errno := n.fs.before(f.fd(), f.name, 0, 0); errno != 0 {
		return nil, nil, 0, errno
	}
	return in, f, fl | keepCache, 0
}

// Setattr records a truncation done by path, then does it.
func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// Through a lazy file handle, its Setattr records the truncation.
	if _, isLazy := fh.(*file); !isLazy {
		if sz, ok := in.GetSize(); ok {
			if errno := n.truncateByPath(int64(sz)); errno != 0 {
				return errno
			}
		}
	}
	return n.LoopbackNode.Setattr(ctx, fh, in, out)
}

func (n *node) truncateByPath(sz int64) syscall.Errno {
	p := n.fs.backing + "/" + n.Path(nil)
	fd, err := syscall.Open(p, syscall.O_RDONLY, 0)
	if err != nil {
		return fs.ToErrno(err)
	}
	defer syscall.Close(fd)
	return n.fs.before(fd, n.Path(nil), sz, 1<<62)
}

func (n *node) wrap(fh fs.FileHandle, name string) *file {
	return &file{LoopbackFile: fh.(*fs.LoopbackFile), fs: n.fs, name: name}
}

// file is a loopback file whose writes a cut can undo.
type file struct {
	*fs.LoopbackFile
	fs   *FS
	name string
}

var (
	_ fs.FileWriter    = (*file)(nil)
	_ fs.FileFsyncer   = (*file)(nil)
	_ fs.FileAllocater = (*file)(nil)
	_ fs.FileSetattrer = (*file)(nil)
)

func (f *file) fd() int {
	fd, _ := f.LoopbackFile.PassthroughFd()
	return fd
}

// PassthroughFd keeps the kernel from bypassing this file system with
// FUSE passthrough: every write must be seen here.
func (f *file) PassthroughFd() (int, bool) { return 0, false }

func (f *file) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if errno := f.fs.before(f.fd(), f.name, off, int64(len(data))); errno != 0 {
		return 0, errno
	}
	return f.LoopbackFile.Write(ctx, data, off)
}

// Fsync makes the file's writes durable (for a cut), after SyncDelay.
func (f *file) Fsync(_ context.Context, _ uint32) syscall.Errno {
	time.Sleep(f.fs.syncDelay())
	return f.fs.synced(f.fd())
}

func (f *file) Allocate(ctx context.Context, off, sz uint64, mode uint32) syscall.Errno {
	if errno := f.fs.before(f.fd(), f.name, int64(off), min(int64(sz), 1)); errno != 0 {
		return errno
	}
	return f.LoopbackFile.Allocate(ctx, off, sz, mode)
}

func (f *file) Setattr(ctx context.Context, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if errno := f.fs.before(f.fd(), f.name, int64(sz), 1<<62); errno != 0 {
			return errno
		}
	}
	return f.LoopbackFile.Setattr(ctx, in, out)
}
