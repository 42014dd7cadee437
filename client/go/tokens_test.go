package txmq

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTokenNeedsTLSOffLoopback(t *testing.T) {
	require.True(t, loopbackOnly([]string{"127.0.0.1:7420", "[::1]:7420", "localhost:7420"}))
	require.False(t, loopbackOnly([]string{"127.0.0.1:7420", "10.0.0.1:7420"}))
	require.False(t, loopbackOnly([]string{"broker.example:7420"}))
	md, err := TokenCredentials("t", false).GetRequestMetadata(context.Background())
	require.NoError(t, err)
	require.Equal(t, "Bearer t", md["authorization"])
	require.True(t, TokenCredentials("t", false).RequireTransportSecurity())
}
