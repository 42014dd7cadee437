package broker

import (
	"context"
	"slices"
	"sync"

	"google.golang.org/grpc/stats"
)

// connTracker counts each principal's open connections (auth on). It is
// the gRPC server's stats handler: every connection gets a connState when
// it opens, and gives back what it holds when it closes. A connection
// belongs to the principals of its calls (a token is known only at the
// first call, so a certificate's principal is bound then too), and each
// counts it once, bound by the auth interceptors (authorizer.bindConn).
type connTracker struct{ limits *limiter }

type connKey struct{}

// connState is what one connection holds.
type connState struct {
	mu     sync.Mutex
	closed bool
	held   []string // principals that count this connection
}

func (t connTracker) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, &connState{})
}

func (t connTracker) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnEnd); !ok {
		return
	}
	cs, _ := ctx.Value(connKey{}).(*connState)
	if cs == nil {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.closed = true
	for _, name := range cs.held {
		t.limits.closeConn(name)
	}
	cs.held = nil
}

func (connTracker) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (connTracker) HandleRPC(context.Context, stats.RPCStats)                       {}

// bindConn counts the call's connection for pr, once per connection. A
// connection over pr's limit is refused on this call; it is not closed,
// and a later call on it gets in once one of pr's others has closed.
func (a *authorizer) bindConn(ctx context.Context, pr *principal) error {
	cs, _ := ctx.Value(connKey{}).(*connState)
	if cs == nil {
		return nil
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	// A call still running on a connection that has closed binds nothing.
	if cs.closed || slices.Contains(cs.held, pr.name) {
		return nil
	}
	if err := a.limits.openConn(pr); err != nil {
		return err
	}
	cs.held = append(cs.held, pr.name)
	return nil
}
