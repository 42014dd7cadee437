package checkback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// ErrUnknownInstance: a heartbeat from an instance the leader does not know
// (new leader, or lease expired). The instance registers again.
var ErrUnknownInstance = errors.New("unknown producer instance: register again")

// Endpoint is where a producer answers check-backs: its own session stream
// to this broker, a gRPC address serving txmq.v1.TransactionChecker, or an
// HTTP(S) URL taking the JSON form.
type Endpoint struct {
	Session Session
	GRPC    string
	HTTP    string
}

// Session is a producer's own stream to this broker
// (txmq.v1.ProducerService.Session): a check-back goes down it and its
// answer comes back up it, so the producer needs no port of its own.
type Session interface {
	// Check sends req down the stream and waits for the answer. A stream
	// that ended before the answer came is ErrNotReached.
	Check(ctx context.Context, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error)
	// Peer is the producer's address as the stream's connection shows it.
	Peer() string
}

func (e Endpoint) String() string {
	switch {
	case e.Session != nil:
		return "session://" + e.Session.Peer()
	case e.GRPC != "":
		return "grpc://" + e.GRPC
	}
	return e.HTTP
}

// IsZero reports whether no endpoint is set.
func (e Endpoint) IsZero() bool { return e.Session == nil && e.GRPC == "" && e.HTTP == "" }

// ParseEndpoint reads "grpc://host:port", "http://..." or "https://...".
func ParseEndpoint(s string) (Endpoint, error) {
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("callback %q: %w", s, err)
	}
	switch u.Scheme {
	case "grpc":
		return GRPCEndpoint(u.Host)
	case "http", "https":
		if u.Host == "" {
			return Endpoint{}, fmt.Errorf("callback %q has no host", s)
		}
		return Endpoint{HTTP: s}, nil
	}
	return Endpoint{}, fmt.Errorf("callback %q: use grpc://host:port, http:// or https://", s)
}

// GRPCEndpoint checks a host:port address.
func GRPCEndpoint(addr string) (Endpoint, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return Endpoint{}, fmt.Errorf("callback address %q is not host:port", addr)
	}
	return Endpoint{GRPC: addr}, nil
}

// Instance is one registered producer instance.
type Instance struct {
	Group         string
	ID            string
	Endpoint      Endpoint
	RegisteredAt  time.Time
	LastHeartbeat time.Time
	LeaseExpires  time.Time
}

// Registry holds the producer instances registered on this leader. It is
// not replicated: after a leader change producers register again (their
// heartbeats get ErrUnknownInstance), within a heartbeat period or two.
type Registry struct {
	now      func() time.Time
	lease    time.Duration
	onJoined func(group string)

	mu     sync.Mutex
	groups map[string]*members
}

type members struct {
	list []*Instance
	rr   int
}

func newRegistry(now func() time.Time, lease time.Duration, onJoined func(string)) *Registry {
	return &Registry{now: now, lease: lease, onJoined: onJoined, groups: map[string]*members{}}
}

// Register adds or refreshes an instance and returns when its lease ends.
func (r *Registry) Register(group, id string, ep Endpoint) time.Time {
	now := r.now()
	r.mu.Lock()
	m := r.groups[group]
	if m == nil {
		m = &members{}
		r.groups[group] = m
	}
	hadLive := m.live(now) > 0
	i := slices.IndexFunc(m.list, func(x *Instance) bool { return x.ID == id })
	if i < 0 {
		m.list = append(m.list, &Instance{Group: group, ID: id, RegisteredAt: now})
		i = len(m.list) - 1
	}
	in := m.list[i]
	in.Endpoint = ep
	in.LastHeartbeat = now
	in.LeaseExpires = now.Add(r.lease)
	r.mu.Unlock()
	if !hadLive && r.onJoined != nil {
		r.onJoined(group)
	}
	return in.LeaseExpires
}

// Heartbeat renews an instance's lease. A heartbeat on a session (on not
// zero) renews only a registration made on that session: an instance that
// registered on another one registers again on this one.
func (r *Registry) Heartbeat(group, id string, on Endpoint) (time.Time, error) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.groups[group]; m != nil {
		for _, in := range m.list {
			if in.ID == id && now.Before(in.LeaseExpires) && (on.IsZero() || in.Endpoint == on) {
				in.LastHeartbeat = now
				in.LeaseExpires = now.Add(r.lease)
				return in.LeaseExpires, nil
			}
		}
	}
	return time.Time{}, ErrUnknownInstance
}

func (m *members) live(now time.Time) int {
	n := 0
	for _, in := range m.list {
		if now.Before(in.LeaseExpires) {
			n++
		}
	}
	return n
}

// HasLive reports whether a group has an instance with a valid lease.
func (r *Registry) HasLive(group string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.groups[group]
	return m != nil && m.live(r.now()) > 0
}

// Pick returns the group's next live instance, round robin, and forgets
// instances whose lease ended.
func (r *Registry) Pick(group string) (Instance, bool) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.groups[group]
	if m == nil {
		return Instance{}, false
	}
	m.list = slices.DeleteFunc(m.list, func(in *Instance) bool { return !now.Before(in.LeaseExpires) })
	if len(m.list) == 0 {
		delete(r.groups, group)
		return Instance{}, false
	}
	m.rr = (m.rr + 1) % len(m.list)
	return *m.list[m.rr], true
}

// List returns the live instances of a group ("" for every group), sorted.
func (r *Registry) List(group string) []Instance {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Instance
	for g, m := range r.groups {
		if group != "" && g != group {
			continue
		}
		for _, in := range m.list {
			if now.Before(in.LeaseExpires) {
				out = append(out, *in)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Group != out[j].Group {
			return out[i].Group < out[j].Group
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Unregister forgets an instance at once, if it is still registered at ep
// (a session that ended forgets only what registered on it, not a newer
// registration of the same instance elsewhere). It reports whether it
// forgot one.
func (r *Registry) Unregister(group, id string, ep Endpoint) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.groups[group]
	if m == nil {
		return false
	}
	n := len(m.list)
	m.list = slices.DeleteFunc(m.list, func(in *Instance) bool { return in.ID == id && in.Endpoint == ep })
	if len(m.list) == 0 {
		delete(r.groups, group)
	}
	return len(m.list) < n
}

// Reset forgets every instance registered by address (on becoming leader:
// registrations made with an earlier leader are not known here). Instances
// registered on a session to this node stay: their stream is open, so they
// are alive and reach this node.
func (r *Registry) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for g, m := range r.groups {
		m.list = slices.DeleteFunc(m.list, func(in *Instance) bool { return in.Endpoint.Session == nil })
		if len(m.list) == 0 {
			delete(r.groups, g)
		}
	}
}
