package checkback

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"sort"
	"sync"
	"time"
)

// ErrUnknownInstance: a heartbeat from an instance the leader does not know
// (new leader, or lease expired). The instance registers again.
var ErrUnknownInstance = errors.New("unknown producer instance: register again")

// Endpoint is where a producer answers check-backs: a gRPC address serving
// txmq.v1.TransactionChecker, or an HTTP(S) URL taking the JSON form.
type Endpoint struct {
	GRPC string
	HTTP string
}

func (e Endpoint) String() string {
	if e.GRPC != "" {
		return "grpc://" + e.GRPC
	}
	return e.HTTP
}

// IsZero reports whether no endpoint is set.
func (e Endpoint) IsZero() bool { return e.GRPC == "" && e.HTTP == "" }

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

// Heartbeat renews an instance's lease.
func (r *Registry) Heartbeat(group, id string) (time.Time, error) {
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if m := r.groups[group]; m != nil {
		for _, in := range m.list {
			if in.ID == id && now.Before(in.LeaseExpires) {
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

// Reset forgets every instance (on becoming leader: registrations made
// with an earlier leader are not known here).
func (r *Registry) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups = map[string]*members{}
}
