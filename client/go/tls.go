package txmq

import (
	"crypto/tls"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// transportCredentials is TLS with conf, or plaintext when conf is nil
// (the quick start's brokers on 127.0.0.1).
func transportCredentials(conf *tls.Config) grpc.DialOption {
	if conf == nil {
		return grpc.WithTransportCredentials(insecure.NewCredentials())
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(conf))
}
