package halfstore

import (
	"github.com/txmq/txmq/halfstore/storepb"
)

// Where each cluster member serves the API and the RocketMQ protocol
// (nodes), replicated so that every node can name the leader's addresses.

// SetNode records (or, with an empty gRPC address, forgets) where a
// cluster member serves the API, and the RocketMQ protocol ("" if not).
func (t *Tx) SetNode(id, grpcAddr, rocketmqAddr string) error {
	if err := checkName("node ID", id); err != nil {
		return err
	}
	b := t.tx.Bucket(bktNodes)
	if grpcAddr == "" {
		return b.Delete([]byte(id))
	}
	return put(b, []byte(id), &storepb.Node{Id: id, GrpcAddress: grpcAddr, RocketmqAddress: rocketmqAddr})
}

// Node is a cluster member's record; its addresses are "" if unknown.
func (t *Tx) Node(id string) (*storepb.Node, error) {
	n := &storepb.Node{}
	if _, err := get(t.tx.Bucket(bktNodes), []byte(id), n); err != nil {
		return nil, err
	}
	return n, nil
}

// NodeAddr is where a cluster member serves the API, "" if unknown.
func (t *Tx) NodeAddr(id string) (string, error) {
	n, err := t.Node(id)
	if err != nil {
		return "", err
	}
	return n.GrpcAddress, nil
}
