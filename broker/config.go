package broker

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/internal/bounds"
	"github.com/txmq/txmq/raftlog"
)

// Config configures a broker. Defaults fills the zero fields.
type Config struct {
	// Raft configures the node; its OnApply is the broker's, and its Hooks
	// are called after the broker's own (metrics).
	Raft raftlog.Config
	// GRPCAddr is where the gRPC API listens, unless GRPCListener is set.
	GRPCAddr string
	// GRPCListener, when set, is the listener the API is served on (tests
	// hand over one bound to 127.0.0.1:0, so no port is chosen twice).
	GRPCListener net.Listener
	// TLS, when set, serves the API over TLS (tlsconf.Source.ServerConfig).
	// Calls to other nodes' APIs (joining, announcing, cluster status)
	// use Raft.PeerTLS.
	TLS *tls.Config
	// GRPCAdvertise is the address other nodes and clients reach the API
	// at; defaults to the bound GRPCAddr.
	GRPCAdvertise string
	// RocketMQAdvertise is where RocketMQ clients reach this node's
	// remoting listener (package rocketmq), announced with its gRPC
	// address so that a follower names the leader's in route answers;
	// empty when the node serves no RocketMQ.
	RocketMQAdvertise string
	// Join lists gRPC addresses of cluster members to join through.
	Join []string
	// MetricsAddr serves /metrics, /healthz and /readyz over HTTP; empty
	// (and no MetricsListener) turns it off.
	MetricsAddr string
	// MetricsListener, when set, is used instead of MetricsAddr.
	MetricsListener net.Listener

	// AckDeadline: an unacked delivery is redelivered after it, unless
	// the consumer group sets its own.
	AckDeadline time.Duration
	// MaxDeliveries: deliveries of a message before it moves to the
	// group's dead-letter queue, unless the group sets its own.
	MaxDeliveries uint32
	// RedeliveryBackoff: delay before redelivery after the n-th failure
	// (the last entry repeats), unless the group sets its own.
	RedeliveryBackoff []time.Duration
	// Retention: committed messages older than this are dropped.
	Retention time.Duration
	// RetentionBytes: when a topic's log is larger, its oldest messages are
	// dropped; 0 means no size limit.
	RetentionBytes uint64
	// RetentionInterval is how often the leader looks for messages to drop
	// (and prunes resolved half messages and dedup keys).
	RetentionInterval time.Duration
	// AutoCreateTopics creates a topic on its first message or
	// subscription. When false, topics need CreateTopic first.
	AutoCreateTopics *bool
	// DedupWindow: a Send repeating a key within it returns the first
	// message ID. Disabled turns dedup off.
	DedupWindow time.Duration
	// MaxMessageSize bounds a message body.
	MaxMessageSize int
	// MaxInFlight is the per-stream limit of unacked deliveries when the
	// subscriber does not ask for one; MaxInFlightLimit caps what it asks.
	MaxInFlight      int
	MaxInFlightLimit int
	// DefaultCheckAfter is when the first check-back of a half message is
	// due unless the producer asks otherwise.
	DefaultCheckAfter time.Duration
	// AuthFile is the auth file of principals and rules (docs/security.md);
	// empty turns authentication and authorization off.
	AuthFile string
	// CallbackAllow lists the hosts, IP addresses and CIDR networks of
	// producer callbacks the broker may call, besides the addresses
	// producers register from; empty means loopback only
	// (checkback.DefaultCallbackAllow).
	CallbackAllow []string
	// PeerToken is the token this node presents to the other members'
	// API (to join, and for their views in ClusterStatus) when they have
	// an auth file: its principal needs admin:read and admin:write on
	// cluster. It travels without TLS to loopback addresses only.
	PeerToken string
	// Limits bound each principal (with auth on) and the instances of a
	// producer group.
	Limits Limits

	// CheckBack configures the check-back scheduler (its Now is the
	// cluster's time, its Logger the broker's).
	CheckBack checkback.Config

	Logger *slog.Logger
	// Now is this machine's clock. What the broker stamps into commands
	// and schedules by is the cluster's time derived from it and the
	// other voters' (clock.go).
	Now func() time.Time
}

// Defaults, used by Config.Defaults and cmd/broker's flags alike.
const (
	DefaultGRPCAddr          = "127.0.0.1:7420"
	DefaultRaftAddr          = "127.0.0.1:7421"
	DefaultMetricsAddr       = "127.0.0.1:7422"
	DefaultAckDeadline       = 30 * time.Second
	DefaultMaxDeliveries     = 16
	DefaultRetention         = 72 * time.Hour
	DefaultRetentionInterval = 10 * time.Second
	DefaultDedupWindow       = 10 * time.Minute
	DefaultMaxMessage        = 4 << 20
	DefaultMaxInFlight       = 64
	DefaultMaxInFlightLimit  = 10000
	DefaultCheckAfter        = 6 * time.Second
)

// Disabled, as a DedupWindow, turns the feature off (zero means the
// default).
const Disabled time.Duration = -1

// DefaultRedeliveryBackoff is RocketMQ's retry schedule: 1s 5s 10s 30s 1m
// 2m ... 10m 20m 30m 1h 2h.
func DefaultRedeliveryBackoff() []time.Duration {
	s := []time.Duration{time.Second, 5 * time.Second, 10 * time.Second, 30 * time.Second}
	for m := 1; m <= 10; m++ {
		s = append(s, time.Duration(m)*time.Minute)
	}
	return append(s, 20*time.Minute, 30*time.Minute, time.Hour, 2*time.Hour)
}

// checkBackoff validates a redelivery schedule.
func checkBackoff(s []time.Duration) error {
	if err := bounds.BackoffSteps.Check("steps", len(s)); err != nil {
		return err
	}
	for i, d := range s {
		if err := bounds.RedeliveryStep.Check(fmt.Sprintf("step %d", i+1), d); err != nil {
			return err
		}
	}
	return nil
}

// Defaults returns cfg with its zero fields set.
func (cfg Config) Defaults() Config {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if cfg.GRPCAddr == "" {
		cfg.GRPCAddr = DefaultGRPCAddr
	}
	if cfg.Raft.RaftAddr == "" {
		cfg.Raft.RaftAddr = DefaultRaftAddr
	}
	def(&cfg.AckDeadline, DefaultAckDeadline)
	def(&cfg.Retention, DefaultRetention)
	def(&cfg.RetentionInterval, DefaultRetentionInterval)
	def(&cfg.DedupWindow, DefaultDedupWindow)
	def(&cfg.DefaultCheckAfter, DefaultCheckAfter)
	if cfg.MaxDeliveries == 0 {
		cfg.MaxDeliveries = DefaultMaxDeliveries
	}
	if len(cfg.RedeliveryBackoff) == 0 {
		cfg.RedeliveryBackoff = DefaultRedeliveryBackoff()
	}
	if cfg.AutoCreateTopics == nil {
		t := true
		cfg.AutoCreateTopics = &t
	}
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = DefaultMaxMessage
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.MaxInFlightLimit == 0 {
		cfg.MaxInFlightLimit = DefaultMaxInFlightLimit
	}
	cfg.Limits = cfg.Limits.Defaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Raft.Logger = cfg.Logger
	cfg.CheckBack.Logger = cfg.Logger
	cfg.CheckBack = cfg.CheckBack.Defaults()
	return cfg
}

// Validate says which field is wrong.
func (cfg Config) Validate() error {
	errs := []error{
		bounds.AckDeadline.Check("AckDeadline", cfg.AckDeadline),
		bounds.MaxDeliveries.Check("MaxDeliveries", cfg.MaxDeliveries),
		bounds.CheckAfter.Check("DefaultCheckAfter", cfg.DefaultCheckAfter),
	}
	errs = append(errs,
		bounds.RetentionInterval.Check("RetentionInterval", cfg.RetentionInterval),
		bounds.MessageSize.Check("MaxMessageSize", cfg.MaxMessageSize),
		bounds.Range[int]{Min: 1, Max: cfg.MaxInFlightLimit}.Check("MaxInFlight", cfg.MaxInFlight))
	if cfg.Retention < time.Second {
		errs = append(errs, fmt.Errorf("retention %s is under 1s", cfg.Retention))
	}
	if cfg.DedupWindow < 0 && cfg.DedupWindow != Disabled {
		errs = append(errs, fmt.Errorf("dedup window %s is negative (Disabled turns dedup off)", cfg.DedupWindow))
	}
	errs = append(errs, cfg.Limits.validate())
	if err := checkBackoff(cfg.RedeliveryBackoff); err != nil {
		errs = append(errs, fmt.Errorf("RedeliveryBackoff: %w", err))
	}
	if cfg.RocketMQAdvertise != "" {
		errs = append(errs, checkRocketMQAddr(cfg.RocketMQAdvertise))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("broker: config: %w", err)
	}
	if err := cfg.CheckBack.Validate(); err != nil {
		return err
	}
	return cfg.Raft.Validate()
}
