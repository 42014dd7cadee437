package tlsconf

import (
	"context"
	"log/slog"
	"os"
	"time"
)

// Watch reads sources again when their files change (polled every
// interval) and, unconditionally, on each value of hup (SIGHUP), until
// ctx ends. A reading that fails keeps the old certificates and is logged.
func Watch(ctx context.Context, every time.Duration, hup <-chan os.Signal, log *slog.Logger, sources ...*Source) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		forced := false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-hup:
			forced = true
		}
		for _, s := range sources {
			if !forced && !s.Changed() {
				continue
			}
			switch changed, err := s.Reload(); {
			case err != nil:
				log.Warn("tls: kept the old certificates", "err", err)
			case changed:
				log.Info("tls: certificates read again", "cert", s.files.Cert, "ca", s.files.CA)
			}
		}
	}
}
