package buildinfo

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGetReportsGoVersionAndOverride(t *testing.T) {
	info := Get()
	require.Equal(t, runtime.Version(), info.GoVersion)
	require.NotEmpty(t, info.Version)

	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v9.8.7"
	require.Equal(t, "v9.8.7", Get().Version)
}

func TestLine(t *testing.T) {
	full := Info{Version: "v1.4.0", Revision: "0123456789abcdef0123", Time: "2026-12-01T10:00:00Z", Modified: true, GoVersion: "go1.27.3"}
	require.Equal(t, "broker v1.4.0 (revision 0123456789ab, 2026-12-01T10:00:00Z, modified) go1.27.3", full.Line("broker"))
	bare := Info{Version: "(devel)", GoVersion: "go1.27.3"}
	require.Equal(t, "brokerctl (devel) go1.27.3", bare.Line("brokerctl"))
}
