package broker

import (
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// serverCredentials are the API's: TLS when configured, else plaintext.
func (b *Broker) serverCredentials() grpc.ServerOption {
	if b.cfg.TLS == nil {
		return grpc.Creds(insecure.NewCredentials())
	}
	return grpc.Creds(credentials.NewTLS(b.cfg.TLS))
}

// peerTLS is the client side of this node's calls to other nodes' APIs,
// which are served as this one's is: nil (plaintext) when the API has no
// TLS; else the node's peer certificate and the cluster's CA when set,
// and the system's roots when not.
func (b *Broker) peerTLS() *tls.Config {
	switch {
	case b.cfg.TLS == nil:
		return nil
	case b.cfg.Raft.PeerTLS != nil:
		return b.cfg.Raft.PeerTLS
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}

// peerCredentials are peerTLS as a dial option.
func (b *Broker) peerCredentials() grpc.DialOption {
	if conf := b.peerTLS(); conf != nil {
		return grpc.WithTransportCredentials(credentials.NewTLS(conf))
	}
	return grpc.WithTransportCredentials(insecure.NewCredentials())
}
