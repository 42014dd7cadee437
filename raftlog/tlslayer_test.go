package raftlog

import (
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/internal/certgen"
	"github.com/txmq/txmq/internal/tlsconf"
)

// A client that connects to the Raft port and says nothing does not hold
// up a peer's connection: handshakes run apart from Accept.
func TestTLSLayerSilentClientDoesNotBlockPeers(t *testing.T) {
	ca, err := certgen.NewCA("cluster")
	require.NoError(t, err)
	files, err := ca.WriteFiles(t.TempDir(), "n1", "127.0.0.1")
	require.NoError(t, err)
	src, err := tlsconf.Load(tlsconf.Files(files))
	require.NoError(t, err)
	conf := src.PeerConfig("")

	layer, err := streamLayer(Config{RaftAddr: "127.0.0.1:0", PeerTLS: conf}, slog.Default())
	require.NoError(t, err)
	defer layer.Close()
	addr := raft.ServerAddress(layer.Addr().String())

	silent, err := net.Dial("tcp", string(addr))
	require.NoError(t, err)
	defer silent.Close()

	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := layer.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	began := time.Now()
	out, err := layer.Dial(addr, 3*time.Second)
	require.NoError(t, err)
	defer out.Close()
	select {
	case in := <-accepted:
		defer in.Close()
	case <-time.After(3 * time.Second):
		t.Fatal("the peer's connection was not accepted while a silent client waits")
	}
	require.Less(t, time.Since(began), handshakeTimeout, "the peer waited for the silent client's handshake")
}
