package broker

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/bcrypt"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
)

// authorizer authenticates every call (a bearer token, or a verified
// client certificate) and checks it against the auth file's rules before
// its handler runs: one interceptor for unary calls, one for streams,
// which checks each request of the stream. It is nil when auth is off.
type authorizer struct {
	b      *Broker
	path   string
	log    *slog.Logger
	pol    atomic.Pointer[aclPolicy]
	limits *limiter

	mu sync.Mutex
	// Tokens (by their SHA-256) already compared with the hashes of the
	// auth file in force: verified ones → principal (at most one per
	// principal), and wrong ones (at most maxWrongTokens). Both are
	// forgotten on reload.
	tokens map[[32]byte]string
	wrong  map[[32]byte]struct{}
}

// maxWrongTokens bounds the wrong tokens remembered; past it, the list
// starts again.
const maxWrongTokens = 4096

func newAuthorizer(b *Broker) (*authorizer, error) {
	if b.cfg.AuthFile == "" {
		return nil, nil
	}
	pol, err := loadPolicy(b.cfg.AuthFile)
	if err != nil {
		return nil, err
	}
	a := &authorizer{b: b, path: b.cfg.AuthFile, log: b.cfg.Logger.With("component", "audit", "node", b.cfg.Raft.NodeID),
		limits: newLimiter(b.cfg.Limits, b.metrics)}
	a.forgetTokens()
	a.pol.Store(pol)
	return a, nil
}

// ReloadAuth reads the auth file again (SIGHUP). A file that does not
// load keeps the rules in force, and the error says why. With auth off it
// does nothing.
func (b *Broker) ReloadAuth() error {
	a := b.auth
	if a == nil {
		return nil
	}
	pol, err := loadPolicy(a.path)
	if err != nil {
		b.log.Error("auth file not reloaded; the previous rules stay in force", "err", err)
		return err
	}
	a.mu.Lock()
	a.pol.Store(pol)
	// A revoked or changed token is refused from the next call on, and
	// a new one is let in.
	a.forgetTokens()
	a.mu.Unlock()
	a.limits.reset(pol)
	b.log.Info("auth file reloaded", "principals", len(pol.principals), "rules", len(pol.rules))
	return nil
}

// authenticate names the caller's principal: from a bearer token when
// one is sent, else from a verified client certificate.
func (a *authorizer) authenticate(ctx context.Context) (*principal, error) {
	pol := a.pol.Load()
	md, _ := metadata.FromIncomingContext(ctx)
	if vals := md.Get("authorization"); len(vals) > 0 {
		token, ok := strings.CutPrefix(vals[0], "Bearer ")
		if !ok || token == "" {
			return nil, refusef(errUnauthenticated, `the authorization metadata must be "Bearer <token>"`)
		}
		if pr := a.tokenPrincipal(pol, token); pr != nil {
			return pr, nil
		}
		return nil, refusef(errUnauthenticated, "the token is not valid (wrong, or revoked); ask an operator for one")
	}
	if cert := verifiedCert(ctx); cert != nil {
		for _, id := range certNames(cert, pol.certIdentity) {
			if pr := pol.byCert[id]; pr != nil {
				return pr, nil
			}
			if pr := pol.principals[id]; pr != nil {
				return pr, nil
			}
		}
		return nil, refusef(errUnauthenticated, "the client certificate (%s %q) names no principal of the auth file", pol.certIdentity, strings.Join(certNames(cert, pol.certIdentity), ","))
	}
	return nil, refusef(errUnauthenticated, "credentials required: send a token (authorization: Bearer <token>, brokerctl --token) or a client certificate")
}

// tokenPrincipal finds the principal whose hash the token matches. The
// answer is remembered until the next reload, so that bcrypt's cost is
// paid once per token, not per call: a wrong token costs one bcrypt per
// principal, and a client that retries with a wrong one would otherwise
// pay it every time.
func (a *authorizer) tokenPrincipal(pol *aclPolicy, token string) *principal {
	key := tokenKey(token)
	a.mu.Lock()
	name, ok := a.tokens[key]
	_, wrong := a.wrong[key]
	a.mu.Unlock()
	switch {
	case ok:
		return pol.principals[name]
	case wrong:
		return nil
	}
	var found *principal
	for _, pr := range pol.principals {
		if pr.tokenHash != nil && bcrypt.CompareHashAndPassword(pr.tokenHash, []byte(token)) == nil {
			found = pr
			break
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	// Only if no reload came in between.
	if a.pol.Load() != pol {
		return found
	}
	if found != nil {
		a.tokens[key] = found.name
		return found
	}
	if len(a.wrong) >= maxWrongTokens {
		a.wrong = map[[32]byte]struct{}{}
	}
	a.wrong[key] = struct{}{}
	return nil
}

// forgetTokens empties the caches of tokens; a.mu is held, or a is new.
func (a *authorizer) forgetTokens() {
	a.tokens = map[[32]byte]string{}
	a.wrong = map[[32]byte]struct{}{}
}

// verifiedCert is the client's certificate when the TLS handshake
// verified its chain.
func verifiedCert(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil
	}
	return info.State.VerifiedChains[0][0]
}

// certNames are the identities of a certificate of the kind the auth
// file's cert_identity names.
func certNames(c *x509.Certificate, kind string) []string {
	switch kind {
	case "dns":
		return c.DNSNames
	case "uri":
		var s []string
		for _, u := range c.URIs {
			s = append(s, u.String())
		}
		return s
	case "email":
		return c.EmailAddresses
	}
	return []string{c.Subject.CommonName}
}

// check takes one request (of a unary call or of a stream) of method
// from the principal's rate limits and authorizes it.
func (a *authorizer) check(ctx context.Context, pr *principal, method string, req any) error {
	if err := a.limits.allow(pr, proto.Size(req.(proto.Message))); err != nil {
		a.audit(ctx, pr.name, method, "", "limited", err)
		return err
	}
	return a.authorize(ctx, pr, method, req)
}

// authorize checks one request of method against the rules.
func (a *authorizer) authorize(ctx context.Context, pr *principal, method string, req any) error {
	rule, ok := methodNeeds[method]
	if !ok {
		if openMethod(method) {
			return nil
		}
		a.audit(ctx, pr.name, method, "", "deny", nil)
		return refusef(errPermissionDenied, "principal %q may not call %s: no rule covers it", pr.name, method)
	}
	needs, err := rule(a, req)
	if err != nil {
		return err
	}
	pol := a.pol.Load()
	// A stream outlives reloads: its principal is looked up again, and one
	// removed from the file is refused.
	if pr = pol.principals[pr.name]; pr == nil {
		return refusef(errUnauthenticated, "the principal of this stream is no longer in the auth file")
	}
	for _, n := range needs {
		if !pol.decide(pr, n.action, n.typ, n.name) {
			a.audit(ctx, pr.name, method, n.String(), "deny", nil)
			return refusef(errPermissionDenied, "principal %q may not %s on %s (%s)", pr.name, n.action, n.resource(), method)
		}
	}
	for _, n := range needs {
		if n.action == actAdminWrite {
			a.audit(ctx, pr.name, method, n.String(), "allow", nil)
		}
	}
	return nil
}

// openMethod: health is open to probes; reflection needs a principal but
// no rule (it shows the API, never data).
func openMethod(method string) bool {
	return strings.HasPrefix(method, "/grpc.reflection.")
}

// audit logs one decision as one line and counts it.
func (a *authorizer) audit(ctx context.Context, who, method, resource, decision string, err error) {
	a.b.metrics.audit.WithLabelValues(decision).Inc()
	attrs := []any{"principal", who, "peer", streamPeer(ctx), "method", method, "resource", resource, "decision", decision}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	if decision == "allow" {
		a.log.Info("audit", attrs...)
		return
	}
	a.log.Warn("audit", attrs...)
}

func (a *authorizer) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if a == nil || isHealth(info.FullMethod) {
		return handler(ctx, req)
	}
	pr, err := a.authenticate(ctx)
	if err != nil {
		a.audit(ctx, "", info.FullMethod, "", "unauthenticated", err)
		return nil, err
	}
	if err := a.bindConn(ctx, pr); err != nil {
		a.audit(ctx, pr.name, info.FullMethod, "", "limited", err)
		return nil, err
	}
	if err := a.check(ctx, pr, info.FullMethod, req); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func (a *authorizer) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if a == nil || isHealth(info.FullMethod) {
		return handler(srv, ss)
	}
	ctx := ss.Context()
	pr, err := a.authenticate(ctx)
	if err != nil {
		a.audit(ctx, "", info.FullMethod, "", "unauthenticated", err)
		return err
	}
	if err := a.bindConn(ctx, pr); err != nil {
		a.audit(ctx, pr.name, info.FullMethod, "", "limited", err)
		return err
	}
	release, err := a.limits.openStream(pr)
	if err != nil {
		a.audit(ctx, pr.name, info.FullMethod, "", "limited", err)
		return err
	}
	defer release()
	as := &authStream{ServerStream: ss, a: a, pr: pr, method: info.FullMethod}
	as.ctx = context.WithValue(ctx, authStreamKey{}, as)
	return handler(srv, as)
}

func isHealth(method string) bool { return strings.HasPrefix(method, "/grpc.health.") }

// authStream checks every request received on a stream before its
// handler sees it, in the way the stream's protocol can carry a refusal:
//   - a producer session answers each request by its ID, so its handler
//     checks each one (checkSessionRequest) and answers a refusal as the
//     unary call would have, and the session goes on;
//   - a subscription's acks, nacks and extensions have no answer, and
//     ending the stream would hand every delivery in flight back for
//     redelivery: they need no rule (they act on the stream's own group),
//     and over its rate limits the principal waits instead of being
//     refused;
//   - any other request (a subscription's start) that is refused ends the
//     stream with the refusal.
//
// A principal removed from the auth file ends the stream (Unauthenticated).
type authStream struct {
	grpc.ServerStream
	ctx    context.Context
	a      *authorizer
	pr     *principal
	method string
}

type authStreamKey struct{}

func (s *authStream) Context() context.Context { return s.ctx }

func (s *authStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if s.method == producerMethod("Session") {
		return nil
	}
	if r, ok := m.(*txmqv1.SubscribeRequest); ok && r.GetStart() == nil {
		if err := s.a.limits.wait(s.ctx, s.pr, proto.Size(r)); err != nil {
			return err
		}
		return s.a.authorize(s.ctx, s.pr, s.method, m)
	}
	return s.a.check(s.ctx, s.pr, s.method, m)
}

// checkSessionRequest checks one request of a producer session whose
// stream ctx is; nil with auth off.
func checkSessionRequest(ctx context.Context, req *txmqv1.SessionRequest) error {
	s, _ := ctx.Value(authStreamKey{}).(*authStream)
	if s == nil {
		return nil
	}
	return s.a.check(ctx, s.pr, s.method, req)
}

// need is one permission a request needs: an action on a resource.
type need struct{ action, typ, name string }

func (n need) resource() string {
	if n.typ == resCluster {
		return resCluster
	}
	return n.typ + ":" + n.name
}

func (n need) String() string { return fmt.Sprintf("%s %s", n.action, n.resource()) }

// peerDialOptions are those of this node's calls to another member's API:
// with the peer token, when there is one.
func (b *Broker) peerDialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{b.peerCredentials()}
	if b.cfg.PeerToken != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(txmq.TokenCredentials(b.cfg.PeerToken)))
	}
	return opts
}
