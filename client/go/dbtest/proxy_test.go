package dbtest

import (
	"bytes"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// cutMode is what the proxy does with the first COMMIT it sees once armed.
type cutMode int

const (
	// cutBeforeCommit drops the COMMIT and the connection: the server never
	// commits, and rolls the transaction back when it sees the close.
	cutBeforeCommit cutMode = iota + 1
	// cutAfterCommit forwards the COMMIT, waits for the server's reply, and
	// drops it and the connection: the server committed, the client cannot
	// know.
	cutAfterCommit
)

// commitProxy forwards TCP connections to a database server and, once
// armed, cuts the connection that sends a COMMIT, so that the client's
// commit fails with its outcome unknown.
type commitProxy struct {
	t        *testing.T
	upstream string
	commit   []byte // the COMMIT on the wire, as the driver sends it
	lis      net.Listener

	mu    sync.Mutex
	armed cutMode
	cuts  int
}

// Wire forms of a transaction's COMMIT. pgx sends it as a simple Query
// message ("commit" and a NUL); go-sql-driver/mysql as a COM_QUERY packet
// (3-byte length 7, sequence 0, command 3). Neither can match a bound
// parameter such as 'committed'.
var (
	postgresCommit = []byte("commit\x00")
	mysqlCommit    = []byte("\x07\x00\x00\x00\x03COMMIT")
)

func newCommitProxy(t *testing.T, upstream string, commit []byte) *commitProxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &commitProxy{t: t, upstream: upstream, commit: commit, lis: lis}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { p.serve(c) })
		}
	})
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
	})
	return p
}

func (p *commitProxy) addr() string { return p.lis.Addr().String() }

func (p *commitProxy) arm(m cutMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = m
}

func (p *commitProxy) cutCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// take disarms the proxy if chunk holds a COMMIT, and says what to do.
func (p *commitProxy) take(chunk []byte) cutMode {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == 0 || !bytes.Contains(chunk, p.commit) {
		return 0
	}
	m := p.armed
	p.armed = 0
	p.cuts++
	return m
}

func (p *commitProxy) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.upstream)
	if err != nil {
		return
	}
	defer server.Close()
	replies := make(chan struct{}, 1)
	var cut sync.Mutex // held while the server's replies must not pass
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				select {
				case replies <- struct{}{}:
				default:
				}
				cut.Lock()
				_, werr := client.Write(buf[:n])
				cut.Unlock()
				if werr != nil {
					return
				}
			}
			if err != nil {
				client.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			switch p.take(buf[:n]) {
			case cutBeforeCommit:
				return
			case cutAfterCommit:
				cut.Lock()
				// Drain any reply already signalled, then wait for the
				// COMMIT's own.
				select {
				case <-replies:
				default:
				}
				if _, err := server.Write(buf[:n]); err == nil {
					select {
					case <-replies:
					case <-done:
					}
				}
				client.Close()
				cut.Unlock()
				return
			}
			if _, err := server.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
