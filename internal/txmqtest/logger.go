package txmqtest

import (
	"log/slog"
	"os"
)

// Logger is the logger of test nodes and clients: silent, unless
// TXMQ_TEST_LOG names a level (debug, info, warn, error) to log at on
// stderr, for a test that needs looking into.
func Logger() *slog.Logger {
	var level slog.Level
	if v := os.Getenv("TXMQ_TEST_LOG"); v == "" || level.UnmarshalText([]byte(v)) != nil {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}
