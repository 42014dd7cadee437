package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/txmq/txmq/internal/loopback"
)

// listenLoopback listens on addr, which must be a loopback address: the
// profiles show message bodies in memory and cost CPU, so they are never
// served beyond this host.
func listenLoopback(addr string) (net.Listener, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, err
	}
	if !loopback.Addr(addr) {
		return nil, fmt.Errorf("%q is not a loopback address; use 127.0.0.1:PORT", addr)
	}
	return net.Listen("tcp", addr)
}

// servePprof serves net/http/pprof on its own mux, so that nothing else is
// exposed on that listener and the metrics server stays as it was.
func servePprof(l net.Listener, log *slog.Logger) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if err := http.Serve(l, mux); err != nil && !errors.Is(err, net.ErrClosed) {
		log.Error("pprof server stopped", "err", err)
	}
}
