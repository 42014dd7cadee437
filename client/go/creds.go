package txmq

import (
	"context"
	"net/url"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/txmq/txmq/internal/loopback"
)

// TokenCredentials sends a bearer token (authorization: Bearer TOKEN)
// with every call, as brokers with an auth file expect: over TLS, or
// over plaintext to a loopback address only. A call that would send it
// elsewhere in plaintext fails with ErrUnauthenticated, and the token
// stays here.
func TokenCredentials(token string) credentials.PerRPCCredentials {
	return tokenCreds{token: token}
}

type tokenCreds struct{ token string }

func (c tokenCreds) GetRequestMetadata(ctx context.Context, uri ...string) (map[string]string, error) {
	ri, _ := credentials.RequestInfoFromContext(ctx)
	if credentials.CheckSecurityLevel(ri.AuthInfo, credentials.PrivacyAndIntegrity) != nil {
		if host := callHost(uri); !loopback.Addr(host) {
			return nil, status.Errorf(codes.Unauthenticated, "txmq: the token is sent over TLS or to a loopback address only, and %s is neither: configure TLS", host)
		}
	}
	return map[string]string{"authorization": "Bearer " + c.token}, nil
}

// RequireTransportSecurity is false: GetRequestMetadata decides, per
// call, so that loopback brokers need no TLS.
func (c tokenCreds) RequireTransportSecurity() bool { return false }

// callHost is the host:port a call goes to, from the URI gRPC gives
// per-RPC credentials ("https://host:port/service").
func callHost(uri []string) string {
	if len(uri) == 0 {
		return "an unknown address"
	}
	if u, err := url.Parse(uri[0]); err == nil {
		return u.Host
	}
	return uri[0]
}
