package wal

import (
	"os"
	"time"
)

// The space of the last segment just ahead of its tail is written with
// zeros, and synced, before appends reach it. A segment is reserved with
// fallocate, whose blocks are "unwritten" until written: the first write
// into such a block changes the file's extent map, so the fdatasync that
// follows must also commit the file system's journal. Over blocks already
// written, an append's fdatasync writes the data alone (PostgreSQL zeroes
// its WAL segments for the same reason, wal_init_zero). A goroutine does
// it off the appends' path, a chunk at a time, so the log writes zeros
// only as far as it is used (docs/decisions.md).
const (
	// zeroAhead is how far past the tail the zeros reach.
	zeroAhead = 1 << 20
	// zeroChunk is what the zeroer writes and syncs at a time: one flush
	// that does not hold an append's fsync for long.
	zeroChunk = 256 << 10
)

var zeros = make([]byte, zeroChunk)

// zeroRetry is how long the zeroer leaves a segment alone after a failure.
var zeroRetry = time.Second

// zeroTarget is how far the zeros should reach in s; wmu.
func zeroTarget(s *segment) int64 { return min(s.size, s.tail+zeroAhead) }

// zeroBehind says whether appends have used a chunk or more of what the
// zeroer wrote ahead of s's tail; wmu.
func zeroBehind(s *segment) bool { return s.zeroed+zeroChunk <= zeroTarget(s) }

// kickZeroer wakes the zeroer when it is behind in s; wmu.
func (l *Log) kickZeroer(s *segment) {
	if !zeroBehind(s) {
		return
	}
	select {
	case l.zeroKick <- struct{}{}:
	default:
	}
}

// zeroer writes zeros ahead of the last segment's tail until Close. It
// writes and syncs through a file descriptor of its own: a sync that fails
// here is still reported to the log's own descriptor when it next syncs
// (Linux reports a write-back error to every open file that had not seen
// it), so a failure here cannot hide one from the appends. After a failure
// it leaves the segment alone for zeroRetry (the appends there only sync
// more slowly), then tries again when woken, so that a disk that was full
// for a while does not slow the rest of the segment; it warns once per
// segment.
func (l *Log) zeroer() {
	defer close(l.zeroDone)
	var (
		s       *segment // the segment f is open on
		f       *os.File
		failed  *segment // the segment of the last failure, until retryAt
		retryAt time.Time
		warned  *segment
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	for {
		select {
		case <-l.zeroStop:
			return
		case <-l.zeroKick:
		}
		for {
			select {
			case <-l.zeroStop:
				return
			default:
			}
			l.wmu.Lock()
			last := l.lastSegment()
			if last != s && f != nil {
				f.Close()
				f = nil
			}
			s = last
			if s == nil || (s == failed && time.Now().Before(retryAt)) || s.zeroed >= zeroTarget(s) {
				l.wmu.Unlock()
				break
			}
			from := max(s.zeroed, s.tail)
			to := min((from/zeroChunk+1)*zeroChunk, s.size)
			var err error
			if l.zeroFault != nil {
				err = l.zeroFault()
			}
			if f == nil && err == nil {
				f, err = os.OpenFile(s.path, os.O_WRONLY, 0)
			}
			if err == nil {
				_, err = f.WriteAt(zeros[:to-from], from)
			}
			if err == nil {
				s.zeroed = to
			}
			l.wmu.Unlock()
			if err == nil {
				err = datasync(f)
			}
			if err != nil {
				failed, retryAt = s, time.Now().Add(zeroRetry)
				if warned != s {
					warned = s
					l.opts.Logger.Warn("wal: could not write zeros ahead of the log's tail; appends there sync more slowly until it can",
						"file", s.path, "err", err.Error())
				}
				break
			}
		}
	}
}

// stopZeroer stops the zeroer and waits for it; once.
func (l *Log) stopZeroer() {
	l.zeroOnce.Do(func() { close(l.zeroStop) })
	<-l.zeroDone
}

// lastSegment is the segment that takes appends, nil with none; wmu.
func (l *Log) lastSegment() *segment {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.segments) == 0 {
		return nil
	}
	return l.segments[len(l.segments)-1]
}
