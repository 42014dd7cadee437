package txmq_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// TestToken: against a broker with an auth file, a producer with its
// principal's token sends; one without, or with a wrong one, is told
// txmq.ErrUnauthenticated; one outside its grant txmq.ErrPermissionDenied.
func TestToken(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("order-secret"), bcrypt.MinCost)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "auth.yaml")
	require.NoError(t, os.WriteFile(path, []byte(`principals:
  - name: order
    token_hash: "`+string(h)+`"
rules:
  - {who: [order], resources: [topic:orders], actions: [publish], decision: allow}
`), 0o600))
	b := newBrokers(t, 1, func(cfg *broker.Config) { cfg.AuthFile = path }).Leader()
	send := func(token, topic string) error {
		p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{b.Addr()}, Token: token, Logger: txmqtest.Logger()})
		require.NoError(t, err)
		defer p.Close()
		_, err = p.Send(t.Context(), txmq.Message{Topic: topic, Body: []byte("x")})
		return err
	}
	require.NoError(t, send("order-secret", "orders"))
	require.ErrorIs(t, send("", "orders"), txmq.ErrUnauthenticated)
	require.ErrorIs(t, send("wrong", "orders"), txmq.ErrUnauthenticated)
	require.ErrorIs(t, send("order-secret", "payments"), txmq.ErrPermissionDenied)
}

// TestTokenNotSentInPlaintextOffLoopback: a token is not sent without TLS
// to an address that is not loopback (here a name, dialled to the test's
// loopback broker), and the call says why.
func TestTokenNotSentInPlaintextOffLoopback(t *testing.T) {
	b := newBrokers(t, 1, nil).Leader()
	cc, err := grpc.NewClient("passthrough:///broker.example:7420",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", b.Addr())
		}),
		grpc.WithPerRPCCredentials(txmq.TokenCredentials("order-secret")))
	require.NoError(t, err)
	defer cc.Close()
	_, err = txmqv1.NewAdminServiceClient(cc).ClusterStatus(t.Context(), &txmqv1.ClusterStatusRequest{})
	require.Equal(t, codes.Unauthenticated, status.Code(err), "%v", err)
	require.ErrorContains(t, err, "broker.example:7420 is neither")
}
