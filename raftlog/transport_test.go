package raftlog

import (
	"log/slog"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	"github.com/stretchr/testify/require"
)

// Replication never takes hashicorp/raft's pipeline (see newTransport).
func TestTransportDoesNotPipeline(t *testing.T) {
	layer, err := streamLayer(Config{RaftAddr: "127.0.0.1:0"}, slog.Default())
	require.NoError(t, err)
	tr := newTransport(layer, hclog.NewNullLogger())
	defer tr.Close()
	_, err = tr.AppendEntriesPipeline("n2", "127.0.0.1:1")
	require.ErrorIs(t, err, raft.ErrPipelineReplicationNotSupported)
}
