package checkback

import (
	"context"
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// With --callback-ca and a client certificate, the caller reaches HTTPS
// and gRPC endpoints that require mutual TLS; a caller trusting another
// CA, or without a certificate, does not get an answer.
func TestTLSEndpoints(t *testing.T) {
	ca, other := txmqtest.NewCA(t, "producers"), txmqtest.NewCA(t, "other")
	server := ca.Source("producer").ServerConfig(tls.RequireAndVerifyClientCert)

	httpSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"resolution":"commit"}`))
	}))
	httpSrv.TLS = server
	httpSrv.StartTLS()
	defer httpSrv.Close()

	lis := txmqtest.Listen(t)
	grpcSrv := grpc.NewServer(grpc.Creds(credentials.NewTLS(server)))
	txmqv1.RegisterTransactionCheckerServer(grpcSrv, &checker{res: txmqv1.Resolution_RESOLUTION_ROLLBACK})
	go grpcSrv.Serve(lis)
	defer grpcSrv.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	https := Endpoint{HTTP: httpSrv.URL + "/check"}
	gRPC := Endpoint{GRPC: lis.Addr().String()}
	check := func(conf *tls.Config, ep Endpoint) (txmqv1.Resolution, error) {
		c := NewTLSCaller(nil, conf)
		defer c.Close()
		return c.Check(ctx, ep, checkReq())
	}

	good := ca.Source("broker").ClientConfig()
	res, err := check(good, https)
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_COMMIT, res)
	res, err = check(good, gRPC)
	require.NoError(t, err)
	require.Equal(t, txmqv1.Resolution_RESOLUTION_ROLLBACK, res)

	for name, conf := range map[string]*tls.Config{
		"trusting another CA":   other.Source("broker").ClientConfig(),
		"no client certificate": ca.Client(""),
	} {
		for _, ep := range []Endpoint{https, gRPC} {
			_, err := check(conf, ep)
			require.Error(t, err, "%s: %+v", name, ep)
		}
	}
}
