package halfstore

import (
	"github.com/txmq/txmq/halfstore/storepb"
)

// Where each cluster member serves the API (nodes), replicated so that
// every node can name the leader's address.

// SetNode records (or, with an empty address, forgets) where a cluster
// member serves the API.
func (t *Tx) SetNode(id, grpcAddr string) error {
	if err := checkName("node ID", id); err != nil {
		return err
	}
	b := t.tx.Bucket(bktNodes)
	if grpcAddr == "" {
		return b.Delete([]byte(id))
	}
	return put(b, []byte(id), &storepb.Node{Id: id, GrpcAddress: grpcAddr})
}

// NodeAddr is where a cluster member serves the API, "" if unknown.
func (t *Tx) NodeAddr(id string) (string, error) {
	n := &storepb.Node{}
	if _, err := get(t.tx.Bucket(bktNodes), []byte(id), n); err != nil {
		return "", err
	}
	return n.GrpcAddress, nil
}
