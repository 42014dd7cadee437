package broker

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// idMillis reads back the clock idGen wrote, in either case of hex
// digits, and refuses what is not a broker's ID.
func TestIDMillis(t *testing.T) {
	g := newIDGen()
	for _, at := range []time.Time{time.UnixMilli(0), time.UnixMilli(1_800_000_000_123), time.Now()} {
		id := g.next(at)
		ms, ok := idMillis([]byte(id))
		require.True(t, ok)
		require.Equal(t, at.UnixMilli(), ms)
		ms, ok = idMillis([]byte(strings.ToUpper(id)))
		require.True(t, ok)
		require.Equal(t, at.UnixMilli(), ms)
		got, ok := idTime(id)
		require.True(t, ok)
		require.True(t, got.Equal(time.UnixMilli(at.UnixMilli())))
	}
	for _, bad := range []string{"", "0123", strings.Repeat("0", 31), strings.Repeat("0", 33), "0000000g" + strings.Repeat("0", 24)} {
		_, ok := idMillis([]byte(bad))
		require.False(t, ok, "%q", bad)
	}
}
