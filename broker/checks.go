package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
	"github.com/txmq/txmq/halfstore"
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
	return b.notLeaderStatus(&raftlog.NotLeaderError{LeaderID: id, LeaderRaftAddr: addr})
}

func checkEndpoint(ep *txmqv1.CallbackEndpoint) (checkback.Endpoint, error) {
	switch k := ep.GetKind().(type) {
	case *txmqv1.CallbackEndpoint_GrpcAddress:
		e, err := checkback.GRPCEndpoint(k.GrpcAddress)
		if err != nil {
			return e, invalid(err.Error())
		}
		return e, nil
	case *txmqv1.CallbackEndpoint_HttpUrl:
		if !strings.HasPrefix(k.HttpUrl, "http://") && !strings.HasPrefix(k.HttpUrl, "https://") {
			return checkback.Endpoint{}, invalid(fmt.Sprintf("http_url %q must start with http:// or https://", k.HttpUrl))
		}
		e, err := checkback.ParseEndpoint(k.HttpUrl)
		if err != nil {
			return e, invalid(err.Error())
		}
		return e, nil
	}
	return checkback.Endpoint{}, invalid("endpoint is required: a grpc_address or an http_url where the instance answers check-backs")
}

func checkInstanceID(id string) error {
	if id == "" || len(id) > maxInstanceID {
		return invalid(fmt.Sprintf("instance_id must be 1 to %d bytes", maxInstanceID))
	}
	return nil
}

func (s *producerService) RegisterProducer(ctx context.Context, req *txmqv1.RegisterProducerRequest) (*txmqv1.RegisterProducerResponse, error) {
	b := s.b
	if err := checkName("producer_group", req.ProducerGroup); err != nil {
		return nil, err
	}
	if err := checkInstanceID(req.InstanceId); err != nil {
		return nil, err
	}
	ep, err := checkEndpoint(req.Endpoint)
	if err != nil {
		return nil, err
	}
	if err := b.leaderOnly(); err != nil {
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
	b := s.b
	if err := checkName("producer_group", req.ProducerGroup); err != nil {
		return nil, err
	}
	if err := checkInstanceID(req.InstanceId); err != nil {
		return nil, err
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	until, err := b.checks.Registry().Heartbeat(req.ProducerGroup, req.InstanceId)
	if errors.Is(err, checkback.ErrUnknownInstance) {
		return nil, status.Error(codes.NotFound, fmt.Sprintf("producer instance %s of group %s is not registered on this leader: register again", req.InstanceId, req.ProducerGroup))
	}
	return &txmqv1.HeartbeatResponse{LeaseExpiresAt: timestamppb.New(until)}, nil
}

func (s *adminService) CheckHalfMessage(ctx context.Context, req *txmqv1.CheckHalfMessageRequest) (*txmqv1.CheckHalfMessageResponse, error) {
	b := s.b
	if req.MessageId == "" {
		return nil, invalid("message_id is required")
	}
	if err := b.leaderOnly(); err != nil {
		return nil, err
	}
	out, h, err := b.checks.CheckNow(ctx, req.MessageId)
	if err != nil {
		return nil, b.toStatus(err)
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
		if in.Endpoint.GRPC != "" {
			ep.Kind = &txmqv1.CallbackEndpoint_GrpcAddress{GrpcAddress: in.Endpoint.GRPC}
		} else {
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
	cfg, err := s.b.groupConfig(req.ProducerGroup)
	if err != nil {
		return nil, s.b.toStatus(err)
	}
	return &txmqv1.GetProducerGroupConfigResponse{Config: cfg}, nil
}

// groupConfig is a producer group's policy in force, as the API shows it.
func (b *Broker) groupConfig(group string) (*txmqv1.ProducerGroupConfig, error) {
	var out *txmqv1.ProducerGroupConfig
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		pol, err := b.checks.Policy(tx, group)
		if err != nil {
			return err
		}
		out = policyToAPI(group, pol)
		return nil
	})
	return out, err
}

func policyToAPI(group string, p checkback.Policy) *txmqv1.ProducerGroupConfig {
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

func (s *adminService) SetProducerGroupConfig(ctx context.Context, req *txmqv1.SetProducerGroupConfigRequest) (*txmqv1.SetProducerGroupConfigResponse, error) {
	b := s.b
	c := req.Config
	if c == nil {
		return nil, invalid("config is required")
	}
	if err := checkName("producer_group", c.ProducerGroup); err != nil {
		return nil, err
	}
	// Start from what the group has stored (zero = broker default), change
	// the fields that are set.
	var op *raftpb.SetProducerGroup
	err := b.node.Store().View(func(tx *halfstore.Tx) error {
		pg, err := tx.ProducerGroup(c.ProducerGroup)
		if err != nil {
			return err
		}
		op = &raftpb.SetProducerGroup{
			Name: pg.Name, MaxChecks: pg.MaxChecks, CheckBackoff: pg.CheckBackoff, MaxCheckBackoff: pg.MaxCheckBackoff,
			MaxHalfAge: pg.MaxHalfAge, ExpiryAction: uint32(pg.ExpiryAction), CallbackUrl: pg.CallbackUrl,
		}
		return nil
	})
	if err != nil {
		return nil, b.toStatus(err)
	}
	if c.MaxChecks != nil {
		if *c.MaxChecks < 1 || *c.MaxChecks > 1000 {
			return nil, invalid(fmt.Sprintf("max_checks %d is outside 1..1000", *c.MaxChecks))
		}
		op.MaxChecks = *c.MaxChecks
	}
	for _, d := range []struct {
		name     string
		v        *durationpb.Duration
		min, max time.Duration
		dst      *int64
	}{
		{"check_backoff", c.CheckBackoff, 100 * time.Millisecond, time.Hour, &op.CheckBackoff},
		{"max_check_backoff", c.MaxCheckBackoff, 100 * time.Millisecond, 24 * time.Hour, &op.MaxCheckBackoff},
		{"max_half_age", c.MaxHalfAge, time.Second, 30 * 24 * time.Hour, &op.MaxHalfAge},
	} {
		if d.v == nil {
			continue
		}
		if err := d.v.CheckValid(); err != nil {
			return nil, invalid(d.name + ": " + err.Error())
		}
		if v := d.v.AsDuration(); v < d.min || v > d.max {
			return nil, invalid(fmt.Sprintf("%s %s is outside %s..%s", d.name, v, d.min, d.max))
		}
		*d.dst = int64(d.v.AsDuration())
	}
	if op.CheckBackoff > 0 && op.MaxCheckBackoff > 0 && op.MaxCheckBackoff < op.CheckBackoff {
		return nil, invalid("max_check_backoff is below check_backoff")
	}
	switch c.ExpiryAction {
	case txmqv1.ExpiryAction_EXPIRY_ACTION_UNSPECIFIED:
	case txmqv1.ExpiryAction_EXPIRY_ACTION_PARK, txmqv1.ExpiryAction_EXPIRY_ACTION_ROLLBACK:
		op.ExpiryAction = uint32(c.ExpiryAction)
	default:
		return nil, invalid("expiry_action must be PARK or ROLLBACK")
	}
	if c.CallbackUrl != nil {
		if *c.CallbackUrl != "" {
			if _, err := checkback.ParseEndpoint(*c.CallbackUrl); err != nil {
				return nil, invalid(err.Error())
			}
		}
		op.CallbackUrl = *c.CallbackUrl
	}
	if _, err := b.node.Propose(ctx, &raftpb.Command{Now: b.now(), Op: &raftpb.Command_SetProducerGroup{SetProducerGroup: op}}); err != nil {
		return nil, b.toStatus(err)
	}
	b.log.Info("producer group policy changed", "group", c.ProducerGroup)
	b.checks.Wake()
	cfg, err := b.groupConfig(c.ProducerGroup)
	if err != nil {
		return nil, b.toStatus(err)
	}
	return &txmqv1.SetProducerGroupConfigResponse{Config: cfg}, nil
}
