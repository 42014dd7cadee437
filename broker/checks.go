package broker

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/internal/bounds"
	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/raftlog"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Producer registration, check-now and producer group policy: the broker's
// side of check-back. Registrations live on the leader only.

const maxInstanceID = 255

// leaderOnly refuses calls that only the leader serves.
func (b *Broker) leaderOnly() error {
	if b.node.IsLeader() {
		return nil
	}
	id, addr := b.node.Leader()
	return &raftlog.NotLeaderError{LeaderID: id, LeaderRaftAddr: addr}
}

func checkEndpoint(ep *txmqv1.CallbackEndpoint) (checkback.Endpoint, error) {
	switch k := ep.GetKind().(type) {
	case *txmqv1.CallbackEndpoint_GrpcAddress:
		e, err := checkback.GRPCEndpoint(k.GrpcAddress)
		if err != nil {
			return e, invalidf("%v", err)
		}
		return e, nil
	case *txmqv1.CallbackEndpoint_HttpUrl:
		if !strings.HasPrefix(k.HttpUrl, "http://") && !strings.HasPrefix(k.HttpUrl, "https://") {
			return checkback.Endpoint{}, invalidf("http_url %q must start with http:// or https://", k.HttpUrl)
		}
		e, err := checkback.ParseEndpoint(k.HttpUrl)
		if err != nil {
			return e, invalidf("%v", err)
		}
		return e, nil
	case *txmqv1.CallbackEndpoint_Session:
		return checkback.Endpoint{}, invalidf("a session endpoint is registered on the producer's Session stream (its register request), not by RegisterProducer")
	}
	return checkback.Endpoint{}, invalidf("endpoint is required: a grpc_address or an http_url where the instance answers check-backs")
}

// checkReachable refuses a loopback callback (127.x, ::1, localhost)
// when this broker is not itself reached on loopback: the producer is then
// on another host (or another member may become the leader), and dialling
// the address would reach the broker's own host, never the producer.
func (b *Broker) checkReachable(ep checkback.Endpoint) error {
	host := ep.Host()
	self := b.advertised()
	selfHost, _, err := net.SplitHostPort(self)
	if !loopback.Host(host) || (err == nil && loopback.Host(selfHost)) {
		return nil
	}
	return invalidf("callback %s is a loopback address, which only the producer's own host can reach, and this broker is reached at %s, not on loopback: "+
		"advertise an address the brokers can dial (the Go client's CallbackAdvertise), or answer check-backs over the producer's session (the Go client's default)", ep, self)
}

// checkAllowed allows the address the producer registers from, then
// refuses an endpoint the guard does not allow (SSRF): a producer may
// name its own address, or one the operator allows.
func (b *Broker) checkAllowed(ctx context.Context, ep checkback.Endpoint) error {
	if p, ok := peer.FromContext(ctx); ok {
		if ap, err := netip.ParseAddrPort(p.Addr.String()); err == nil {
			b.guard.RegisteredFrom(ap.Addr())
		}
	}
	if err := b.guard.Check(ep.Host()); err != nil {
		return invalidf("endpoint %s: %v", ep, err)
	}
	return nil
}

// checkInstance checks the names of a producer instance.
func checkInstance(group, id string) error {
	if err := checkName("producer_group", group); err != nil {
		return err
	}
	if id == "" || len(id) > maxInstanceID {
		return invalidf("instance_id must be 1 to %d bytes", maxInstanceID)
	}
	return nil
}

func (s *producerService) RegisterProducer(ctx context.Context, req *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
	if err := checkInstance(req.ProducerGroup, req.InstanceId); err != nil {
		return nil, err
	}
	ep, err := checkEndpoint(req.Endpoint)
	if err != nil {
		return nil, err
	}
	if err := s.b.checkReachable(ep); err != nil {
		return nil, err
	}
	if err := s.b.checkAllowed(ctx, ep); err != nil {
		return nil, err
	}
	return s.b.register(req, ep)
}

// register registers a producer instance, whose request is checked, at
// ep, by RegisterProducer or on a session.
func (b *Broker) register(req *txmqv1.RegisterProducerRequest, ep checkback.Endpoint) (*txmqv1.RegisterProducerResponse, error) {
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	if err := b.checkInstances(req.ProducerGroup, req.InstanceId); err != nil {
		return nil, err
	}
	b.checks.Registry().Register(req.ProducerGroup, req.InstanceId, ep)
	b.log.Info("producer registered", "group", req.ProducerGroup, "instance", req.InstanceId, "endpoint", ep.String())
	cfg := b.checks.Config()
	return &txmqv1.RegisterProducerResponse{
		HeartbeatInterval: durationpb.New(cfg.HeartbeatInterval),
		Lease:             durationpb.New(cfg.Lease),
	}, nil
}

func (s *producerService) Heartbeat(ctx context.Context, req *txmqv1.HeartbeatRequest) (*txmqv1.HeartbeatResponse, error) {
	return s.b.heartbeat(req, checkback.Endpoint{})
}

// heartbeat renews a registration: any (on zero, by Heartbeat), or one
// made on the session on.
func (b *Broker) heartbeat(req *txmqv1.HeartbeatRequest, on checkback.Endpoint) (*txmqv1.HeartbeatResponse, error) {
	if err := checkInstance(req.ProducerGroup, req.InstanceId); err != nil {
		return nil, err
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	until, err := b.checks.Registry().Heartbeat(req.ProducerGroup, req.InstanceId, on)
	if err != nil {
		return nil, fmt.Errorf("producer instance %s of group %s is not registered on this leader: %w", req.InstanceId, req.ProducerGroup, err)
	}
	return &txmqv1.HeartbeatResponse{LeaseExpiresAt: timestamppb.New(until)}, nil
}

func (s *adminService) CheckHalfMessage(ctx context.Context, req *txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error) {
	b := s.b
	if err := checkMessageID(req.MessageId); err != nil {
		return nil, err
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	out, h, err := b.checks.CheckNow(ctx, req.MessageId)
	if err != nil {
		return nil, err
	}
	resp := &txmqv1.CheckHalfMessageResponse{
		Answer: out.Answer, InstanceId: out.Instance, Endpoint: out.Endpoint, Message: halfToAPI(h),
	}
	if out.Err != nil {
		resp.Error = out.Err.Error()
	}
	return resp, nil
}

func (s *adminService) ListProducers(ctx context.Context, req *txmqv1.ListProducersRequest) (*txmqv1.ListProducersResponse, error) {
	b := s.b
	if req.ProducerGroup != "" {
		if err := checkName("producer_group", req.ProducerGroup); err != nil {
			return nil, err
		}
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	resp := &txmqv1.ListProducersResponse{}
	for _, in := range b.checks.Registry().List(req.ProducerGroup) {
		ep := &txmqv1.CallbackEndpoint{}
		switch {
		case in.Endpoint.Session != nil:
			ep.Kind = &txmqv1.CallbackEndpoint_Session{Session: in.Endpoint.Session.Peer()}
		case in.Endpoint.GRPC != "":
			ep.Kind = &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: in.Endpoint.GRPC}
		default:
			ep.Kind = &txmqv1.CallbackEndpoint_HttpUrl{HttpUrl: in.Endpoint.HTTP}
		}
		resp.Instances = append(resp.Instances, &txmqv1.ProducerInstance{
			ProducerGroup:  in.Group,
			InstanceId:     in.ID,
			Endpoint:       ep,
			RegisteredAt:   timestamppb.New(in.RegisteredAt),
			LastHeartbeat:  timestamppb.New(in.LastHeartbeat),
			LeaseExpiresAt: timestamppb.New(in.LeaseExpires),
		})
	}
	return resp, nil
}

func (s *adminService) GetProducerGroupConfig(ctx context.Context, req *txmqv1.GetProducerGroupConfigRequest) (*txmqv1.GetProducerGroupConfigResponse, error) {
	if err := checkName("producer_group", req.ProducerGroup); err != nil {
		return nil, err
	}
	cfg, err := s.b.producerGroupConfig(req.ProducerGroup)
	if err != nil {
		return nil, err
	}
	return &txmqv1.GetProducerGroupConfigResponse{Config: cfg}, nil
}

// producerGroupConfig is a producer group's check-back policy in force, as
// the API shows it.
func (b *Broker) producerGroupConfig(group string) (*txmqv1.ProducerGroupConfig, error) {
	var out *txmqv1.ProducerGroupConfig
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		pol, err := b.checks.Policy(tx, group)
		if err != nil {
			return err
		}
		out = producerPolicyToAPI(group, pol)
		return nil
	})
	return out, err
}

func producerPolicyToAPI(group string, p checkback.Policy) *txmqv1.ProducerGroupConfig {
	action := txmqv1.ExpiryAction_EXPIRY_ACTION_PARK
	if p.Rollback {
		action = txmqv1.ExpiryAction_EXPIRY_ACTION_ROLLBACK
	}
	url := ""
	if !p.Callback.IsZero() {
		url = p.Callback.String()
	}
	maxChecks := p.MaxChecks
	return &txmqv1.ProducerGroupConfig{
		ProducerGroup:   group,
		MaxChecks:       &maxChecks,
		CheckBackoff:    durationpb.New(p.Backoff),
		MaxCheckBackoff: durationpb.New(p.MaxBackoff),
		MaxHalfAge:      durationpb.New(p.MaxHalfAge),
		ExpiryAction:    action,
		CallbackUrl:     &url,
	}
}

// SetProducerGroupConfig changes the fields that are set; the state
// machine merges them into the stored policy, so concurrent changes of
// different fields all take effect.
func (s *adminService) SetProducerGroupConfig(ctx context.Context, req *txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
	b := s.b
	c := req.Config
	if c == nil {
		return nil, invalidf("config is required")
	}
	if err := checkName("producer_group", c.ProducerGroup); err != nil {
		return nil, err
	}
	op := &raftpb.UpdateProducerGroup{Name: c.ProducerGroup}
	if c.MaxChecks != nil {
		if err := bounds.MaxChecks.Check("max_checks", *c.MaxChecks); err != nil {
			return nil, invalidf("%v", err)
		}
		op.MaxChecks = c.MaxChecks
	}
	var err error
	if op.CheckBackoff, err = optNanos("check_backoff", c.CheckBackoff, bounds.CheckBackoff); err != nil {
		return nil, err
	}
	if op.MaxCheckBackoff, err = optNanos("max_check_backoff", c.MaxCheckBackoff, bounds.MaxCheckBackoff); err != nil {
		return nil, err
	}
	if op.MaxHalfAge, err = optNanos("max_half_age", c.MaxHalfAge, bounds.MaxHalfAge); err != nil {
		return nil, err
	}
	if op.ExpiryAction, err = expiryAction(c.ExpiryAction); err != nil {
		return nil, err
	}
	if c.CallbackUrl != nil && *c.CallbackUrl != "" {
		ep, err := checkback.ParseEndpoint(*c.CallbackUrl)
		if err != nil {
			return nil, invalidf("%v", err)
		}
		if err := b.guard.Check(ep.Host()); err != nil {
			return nil, invalidf("callback_url: %v", err)
		}
	}
	op.CallbackUrl = c.CallbackUrl
	if _, err := b.node.UpdateProducerGroup(ctx, b.clock.Now(), op); err != nil {
		return nil, err
	}
	b.log.Info("producer group policy changed", "group", c.ProducerGroup)
	b.checks.Wake()
	cfg, err := b.producerGroupConfig(c.ProducerGroup)
	if err != nil {
		return nil, err
	}
	return &txmqv1.SetProducerGroupConfigResponse{Config: cfg}, nil
}
