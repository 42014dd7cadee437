package halfstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

// A member's record keeps both addresses; a record written before the
// RocketMQ address existed loads with it empty; an empty gRPC address
// forgets the member.
func TestNodeRecords(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		if err := tx.SetNode("n1", "127.0.0.1:7420", "127.0.0.1:9876"); err != nil {
			return err
		}
		// What a broker before the field wrote: the same message without it.
		return put(tx.tx.Bucket(bktNodes), []byte("n2"), &storepb.Node{Id: "n2", GrpcAddress: "127.0.0.1:7430"})
	})
	view(t, s, func(tx *Tx) error {
		n1, err := tx.Node("n1")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:7420", n1.GrpcAddress)
		require.Equal(t, "127.0.0.1:9876", n1.RocketmqAddress)
		n2, err := tx.Node("n2")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:7430", n2.GrpcAddress)
		require.Empty(t, n2.RocketmqAddress)
		addr, err := tx.NodeAddr("n2")
		require.NoError(t, err)
		require.Equal(t, "127.0.0.1:7430", addr)
		return nil
	})
	update(t, s, func(tx *Tx) error { return tx.SetNode("n1", "", "") })
	view(t, s, func(tx *Tx) error {
		n1, err := tx.Node("n1")
		require.NoError(t, err)
		require.Empty(t, n1.GrpcAddress)
		require.Empty(t, n1.RocketmqAddress)
		return nil
	})
	require.Error(t, s.Update(func(tx *Tx) error { return tx.SetNode("", "127.0.0.1:1", "") }))
}
