// Package rocketmq serves the RocketMQ remoting protocol (the protocol of
// github.com/apache/rocketmq-client-go/v2 and the Java client) beside
// txmq's gRPC API, over the same store and the same semantics: one port
// answers both name-server and broker requests. It owns the frame codec,
// the RocketMQ message encodings, the mapping of queues and offsets onto
// txmq sequences, and the client connections (which are check-back
// sessions of their producer groups). docs/rocketmq.md says what it maps
// and what it does not do.
package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/raftlog"
)

// Broker is what the front end needs of a txmq node; *broker.Broker
// implements it (broker/remoting.go).
type Broker interface {
	Producer() txmqv1.ProducerServiceServer
	SendReserved(ctx context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error)
	StatusOf(err error) error
	Node() *raftlog.Node
	Now() time.Time
	MaxMessageSize() int
	MaxDeliveries() uint32
	Appended(topic string) <-chan struct{}
	RegisterSession(group, instance string, s checkback.Session) error
	HeartbeatSession(group, instance string, s checkback.Session) error
	UnregisterSession(group, instance string, s checkback.Session)
	HeartbeatInterval() time.Duration
	// RocketMQAddr is the RocketMQ address a cluster member announced,
	// "" if none.
	RocketMQAddr(nodeID string) string
	Barrier(ctx context.Context) error
}

// Config configures a Server.
type Config struct {
	Broker Broker
	Logger *slog.Logger
	// Queues is the number of read and write queues every topic shows
	// (default 4): queue q holds the sequences s with (s-1) mod Queues = q.
	Queues int
	// MaxPollWait caps a PULL_MESSAGE's long poll (default 15 s, under the
	// client's 30 s call timeout).
	MaxPollWait time.Duration
	// WriteTimeout bounds one write to a client; a client that reads
	// nothing for that long is disconnected (default 10 s).
	WriteTimeout time.Duration
	// Advertise is the address routes name for this node (default: the
	// listener's). A follower names the leader's as the leader announced
	// it (Broker.RocketMQAddr).
	Advertise string
}

const (
	// brokerName and clusterName are what routes name this cluster.
	brokerName  = "txmq"
	clusterName = "txmq"
	// outQueue frames may wait to be written to one connection; beyond,
	// the client is not reading and is disconnected.
	outQueue = 256
	// inFlight requests of one connection are handled at once; beyond,
	// its reader waits.
	inFlight = 64
)

// Server is a remoting listener.
type Server struct {
	cfg  Config
	log  *slog.Logger
	lis  net.Listener
	host netip.AddrPort

	mu        sync.Mutex
	conns     map[*conn]struct{}
	consumers map[string]map[string]*conn // group → client ID → connection
	offsets   *offsetCommits
	closed    bool
	wg        sync.WaitGroup
}

// Serve starts answering on lis; Close stops.
func Serve(lis net.Listener, cfg Config) (*Server, error) {
	if cfg.Broker == nil {
		return nil, errors.New("rocketmq: Config.Broker is nil")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Queues == 0 {
		cfg.Queues = 4
	}
	if cfg.Queues < 1 || cfg.Queues > 64 {
		return nil, fmt.Errorf("rocketmq: Queues is %d, want 1 to 64", cfg.Queues)
	}
	if cfg.MaxPollWait == 0 {
		cfg.MaxPollWait = 15 * time.Second
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = 10 * time.Second
	}
	addr := cfg.Advertise
	if addr == "" {
		addr = lis.Addr().String()
	}
	host, err := netip.ParseAddrPort(addr)
	if err != nil || !host.Addr().Unmap().Is4() {
		return nil, fmt.Errorf("rocketmq: address %s is not an IPv4 address and port (RocketMQ message IDs carry one)", addr)
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger.With("component", "rocketmq"), lis: lis, host: host,
		conns: map[*conn]struct{}{}, consumers: map[string]map[string]*conn{}, offsets: newOffsetCommits(),
	}
	s.wg.Add(1)
	go s.accept()
	s.log.Info("rocketmq remoting listener started", "addr", lis.Addr().String(), "queues", cfg.Queues)
	return s, nil
}

// Addr is the address clients use, as name server and as broker.
func (s *Server) Addr() string {
	if s.cfg.Advertise != "" {
		return s.cfg.Advertise
	}
	return s.lis.Addr().String()
}

// leaderAddr is the remoting address of the cluster's leader, "" when it
// is not known.
func (s *Server) leaderAddr() string {
	node := s.cfg.Broker.Node()
	if node.IsLeader() {
		return s.Addr()
	}
	id, _ := node.Leader()
	if id == "" {
		return ""
	}
	return s.cfg.Broker.RocketMQAddr(id)
}

// Close stops listening, closes every connection and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.close()
	}
	s.mu.Unlock()
	err := s.lis.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		nc, err := s.lis.Accept()
		if err != nil {
			return
		}
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.run()
			s.forget(c)
		}()
	}
}

// forget drops an ended connection from the server's tables.
func (s *Server) forget(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, c)
	for g, m := range s.consumers {
		for id, cc := range m {
			if cc == c {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(s.consumers, g)
		}
	}
}

// addConsumer records that client id of group is on c; a newcomer makes
// the group's other clients rebalance now (NOTIFY_CONSUMER_IDS_CHANGED)
// rather than at their next 20 s round.
func (s *Server) addConsumer(group, id string, c *conn) {
	s.mu.Lock()
	m := s.consumers[group]
	if m == nil {
		m = map[string]*conn{}
		s.consumers[group] = m
	}
	_, known := m[id]
	m[id] = c
	var others []*conn
	for oid, oc := range m {
		if oid != id && !known {
			others = append(others, oc)
		}
	}
	s.mu.Unlock()
	for _, oc := range others {
		oc.request(reqNotifyConsumersChanged, map[string]string{"consumerGroup": group}, nil)
	}
}

// removeClient forgets client id in every group (UNREGISTER_CLIENT).
func (s *Server) removeClient(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for g, m := range s.consumers {
		delete(m, id)
		if len(m) == 0 {
			delete(s.consumers, g)
		}
	}
}

// consumerIDs lists the client IDs of a consumer group.
func (s *Server) consumerIDs(group string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.consumers[group]))
	for id := range s.consumers[group] {
		out = append(out, id)
	}
	return out
}
