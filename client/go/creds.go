package txmq

import (
	"context"
	"net"
	"strings"

	"google.golang.org/grpc/credentials"
)

// TokenCredentials sends a bearer token (authorization: Bearer TOKEN)
// with every call, as brokers with an auth file expect. Unless
// insecureOK, gRPC refuses to send it over a connection without TLS.
func TokenCredentials(token string, insecureOK bool) credentials.PerRPCCredentials {
	return tokenCreds{token: token, insecureOK: insecureOK}
}

type tokenCreds struct {
	token      string
	insecureOK bool
}

func (c tokenCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

func (c tokenCreds) RequireTransportSecurity() bool { return !c.insecureOK }

// loopbackOnly reports whether every address is on this machine, where a
// token may travel without TLS.
func loopbackOnly(addrs []string) bool {
	for _, a := range addrs {
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			host = a
		}
		ip := net.ParseIP(host)
		if !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return true
}
