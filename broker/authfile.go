package broker

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"golang.org/x/crypto/bcrypt"
)

// The auth file (--auth-file): principals with their hashed tokens and
// certificate identities, groups of principals, and rules in the style of
// RocketMQ ACL 2.0 with NATS's "deny wins". docs/security.md shows one.

// Actions a rule grants or denies.
const (
	actPublish    = "publish"
	actTransact   = "transact"
	actSubscribe  = "subscribe"
	actAdminRead  = "admin:read"
	actAdminWrite = "admin:write"
)

var knownActions = []string{actPublish, actTransact, actSubscribe, actAdminRead, actAdminWrite}

// Resource types; "cluster" has no name.
var resourceTypes = []string{"topic", "producer-group", "consumer-group"}

const resCluster = "cluster"

// Certificate identities a principal may be known by (cert_identity).
var certIdentities = []string{"cn", "dns", "uri", "email"}

type authFile struct {
	CertIdentity string          `yaml:"cert_identity"`
	Principals   []principalSpec `yaml:"principals"`
	Groups       yaml.Node       `yaml:"groups"`
	Rules        []ruleSpec      `yaml:"rules"`
}

type principalSpec struct {
	Name      string     `yaml:"name"`
	TokenHash string     `yaml:"token_hash"`
	Certs     []string   `yaml:"certs"`
	Limits    limitsSpec `yaml:"limits"`
	Line      int        `yaml:"-"`
}

type limitsSpec struct {
	Requests float64 `yaml:"requests_per_second"`
	Bytes    float64 `yaml:"bytes_per_second"`
	Streams  int     `yaml:"streams"`
	Conns    int     `yaml:"connections"`
}

type ruleSpec struct {
	Who       []string `yaml:"who"`
	Resources []string `yaml:"resources"`
	Actions   []string `yaml:"actions"`
	Decision  string   `yaml:"decision"`
	Line      int      `yaml:"-"`
}

// UnmarshalYAML keeps the line of each principal and rule for errors.
func (p *principalSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain principalSpec
	if err := n.Decode((*plain)(p)); err != nil {
		return err
	}
	p.Line = n.Line
	return nil
}

// UnmarshalYAML keeps the line of each rule for errors.
func (r *ruleSpec) UnmarshalYAML(n *yaml.Node) error {
	type plain ruleSpec
	if err := n.Decode((*plain)(r)); err != nil {
		return err
	}
	r.Line = n.Line
	return nil
}

// policy is a loaded, validated auth file.
type aclPolicy struct {
	certIdentity string
	principals   map[string]*principal
	byCert       map[string]*principal
	rules        []rule
}

type principal struct {
	name      string
	tokenHash []byte
	groups    []string
	limits    limitsSpec
}

type rule struct {
	who       []string // principal names and "group:NAME"
	resources []resourcePattern
	actions   []string
	deny      bool
}

// resourcePattern is "cluster", "*", or a type with a name that is exact,
// a prefix ("orders.*") or any ("*").
type resourcePattern struct {
	typ, name string
}

func (p resourcePattern) matches(typ, name string) bool {
	switch {
	case p.typ == "*":
		return true
	case p.typ != typ:
		return false
	case typ == resCluster || p.name == "*":
		return true
	case strings.HasSuffix(p.name, "*"):
		return name != "*" && strings.HasPrefix(name, strings.TrimSuffix(p.name, "*"))
	}
	return p.name == name
}

func parseResource(s string) (resourcePattern, error) {
	if s == "*" || s == resCluster {
		return resourcePattern{typ: s}, nil
	}
	typ, name, ok := strings.Cut(s, ":")
	if !ok || !slices.Contains(resourceTypes, typ) {
		return resourcePattern{}, fmt.Errorf("resource %q: want topic:NAME, producer-group:NAME, consumer-group:NAME, cluster or *", s)
	}
	if name == "" || strings.Contains(strings.TrimSuffix(name, "*"), "*") {
		return resourcePattern{}, fmt.Errorf("resource %q: the name is exact, a prefix ending in * (orders.*) or *", s)
	}
	return resourcePattern{typ: typ, name: name}, nil
}

// loadPolicy reads and validates an auth file; every error names its line.
func loadPolicy(path string) (*aclPolicy, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	p, err := parsePolicy(raw)
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", path, err)
	}
	return p, nil
}

func parsePolicy(raw []byte) (*aclPolicy, error) {
	var f authFile
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	// An empty file is an empty policy: no one may do anything.
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	p := &aclPolicy{certIdentity: f.CertIdentity, principals: map[string]*principal{}, byCert: map[string]*principal{}}
	if p.certIdentity == "" {
		p.certIdentity = "cn"
	}
	if !slices.Contains(certIdentities, p.certIdentity) {
		return nil, fmt.Errorf("cert_identity %q: want one of %s", p.certIdentity, strings.Join(certIdentities, ", "))
	}
	var errs []error
	for _, ps := range f.Principals {
		errs = append(errs, p.addPrincipal(ps))
	}
	groups, err := parseGroups(&f.Groups, p.principals)
	errs = append(errs, err)
	for _, rs := range f.Rules {
		r, err := parseRule(rs, p.principals, groups)
		errs = append(errs, err)
		p.rules = append(p.rules, r)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *aclPolicy) addPrincipal(ps principalSpec) error {
	at := func(format string, args ...any) error {
		return fmt.Errorf("line %d: principal %q: %s", ps.Line, ps.Name, fmt.Sprintf(format, args...))
	}
	switch {
	case ps.Name == "" || strings.ContainsAny(ps.Name, " :*"):
		return at("a name is required, without spaces, colons or *")
	case p.principals[ps.Name] != nil:
		return at("defined twice")
	case ps.TokenHash == "" && len(ps.Certs) == 0:
		return at("needs a token_hash (brokerctl auth hash) or certs, or it can never sign in")
	case ps.Limits.Requests < 0 || ps.Limits.Bytes < 0 || ps.Limits.Streams < 0 || ps.Limits.Conns < 0:
		return at("limits must not be negative")
	}
	pr := &principal{name: ps.Name, limits: ps.Limits}
	if ps.TokenHash != "" {
		if _, err := bcrypt.Cost([]byte(ps.TokenHash)); err != nil {
			return at("token_hash is not a bcrypt hash (make one with brokerctl auth hash): %v", err)
		}
		pr.tokenHash = []byte(ps.TokenHash)
	}
	for _, c := range ps.Certs {
		if q := p.byCert[c]; q != nil {
			return at("certificate identity %q is already %q's", c, q.name)
		}
		p.byCert[c] = pr
	}
	p.principals[ps.Name] = pr
	return nil
}

// parseGroups reads "groups: {NAME: [principal, ...]}" and records each
// principal's groups.
func parseGroups(n *yaml.Node, principals map[string]*principal) (map[string]bool, error) {
	groups := map[string]bool{}
	if n.Kind == 0 {
		return groups, nil
	}
	var m map[string][]string
	if err := n.Decode(&m); err != nil {
		return nil, fmt.Errorf("line %d: groups: want a map of group name to a list of principals: %v", n.Line, err)
	}
	var errs []error
	for i := 0; i+1 < len(n.Content); i += 2 {
		name, line := n.Content[i].Value, n.Content[i].Line
		groups[name] = true
		for _, who := range m[name] {
			pr := principals[who]
			if pr == nil {
				errs = append(errs, fmt.Errorf("line %d: group %q: no principal %q", line, name, who))
				continue
			}
			pr.groups = append(pr.groups, name)
		}
	}
	return groups, errors.Join(errs...)
}

func parseRule(rs ruleSpec, principals map[string]*principal, groups map[string]bool) (rule, error) {
	at := func(format string, args ...any) error {
		return fmt.Errorf("line %d: rule: %s", rs.Line, fmt.Sprintf(format, args...))
	}
	r := rule{who: rs.Who, actions: rs.Actions}
	switch rs.Decision {
	case "allow":
	case "deny":
		r.deny = true
	default:
		return r, at("decision %q: want allow or deny", rs.Decision)
	}
	if len(rs.Who) == 0 || len(rs.Resources) == 0 || len(rs.Actions) == 0 {
		return r, at("who, resources and actions are all required")
	}
	for _, w := range rs.Who {
		if g, ok := strings.CutPrefix(w, "group:"); ok {
			if !groups[g] {
				return r, at("no group %q", g)
			}
		} else if w != "*" && principals[w] == nil {
			return r, at("no principal %q", w)
		}
	}
	for _, a := range rs.Actions {
		if !slices.Contains(knownActions, a) && a != "*" {
			return r, at("action %q: want %s or *", a, strings.Join(knownActions, ", "))
		}
	}
	for _, s := range rs.Resources {
		res, err := parseResource(s)
		if err != nil {
			return r, at("%v", err)
		}
		r.resources = append(r.resources, res)
	}
	return r, nil
}

// appliesTo reports whether the rule names the principal, one of its
// groups, or everyone.
func (r rule) appliesTo(pr *principal) bool {
	for _, w := range r.who {
		if w == "*" || w == pr.name {
			return true
		}
		if g, ok := strings.CutPrefix(w, "group:"); ok && slices.Contains(pr.groups, g) {
			return true
		}
	}
	return false
}

// decide is the rules' answer for one action on one resource: allowed
// when a rule allows it and none denies it (deny wins); no rule denies.
func (p *aclPolicy) decide(pr *principal, action, typ, name string) bool {
	allowed := false
	for _, r := range p.rules {
		if !r.appliesTo(pr) || (!slices.Contains(r.actions, action) && !slices.Contains(r.actions, "*")) {
			continue
		}
		if slices.ContainsFunc(r.resources, func(res resourcePattern) bool { return res.matches(typ, name) }) {
			if r.deny {
				return false
			}
			allowed = true
		}
	}
	return allowed
}

// tokenKey is what the cache of verified tokens is keyed by: never the
// token itself.
func tokenKey(token string) [32]byte { return sha256.Sum256([]byte(token)) }
