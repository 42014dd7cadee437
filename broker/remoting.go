package broker

import (
	"context"
	"strings"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
)

// The surface other front ends over the same store use (package rocketmq,
// the RocketMQ remoting protocol): the producer service's handlers as
// they are, with their validation, and check-back sessions. A front end's
// connection is a checkback.Session like a producer's gRPC session, so
// that only check-backs it delivered count against max_checks.

// Producer is the producer service, to call directly. Its errors are
// those the gRPC interceptor turns into statuses (StatusOf).
func (b *Broker) Producer() txmqv1.ProducerServiceServer { return &producerService{b: b} }

// SendReserved is Producer().Send into a topic of the broker's own
// (prefix "txmq."), such as the RocketMQ front end's retry topics.
func (b *Broker) SendReserved(ctx context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
	if !strings.HasPrefix(req.Topic, reservedPrefix) {
		return nil, invalidf("topic %q is not one of the broker's own (prefix %q)", req.Topic, reservedPrefix)
	}
	if err := checkName("topic", req.Topic); err != nil {
		return nil, err
	}
	return b.send(ctx, req)
}

// StatusOf is the gRPC status an error of Producer's handlers is worth.
func (b *Broker) StatusOf(err error) error { return b.toStatus(err) }

// Now is the cluster's time (clock.go), what commands are stamped with.
func (b *Broker) Now() time.Time { return b.clock.Now() }

// MaxMessageSize bounds a message body.
func (b *Broker) MaxMessageSize() int { return b.cfg.MaxMessageSize }

// MaxDeliveries is the default number of deliveries before the DLQ.
func (b *Broker) MaxDeliveries() uint32 { return b.cfg.MaxDeliveries }

// Appended returns a channel closed at the next append to topic.
func (b *Broker) Appended(topic string) <-chan struct{} { return b.notify.wait(topic) }

// RegisterSession makes s the check-back endpoint of an instance of a
// producer group, on the leader only; Heartbeat through HeartbeatSession
// renews it.
func (b *Broker) RegisterSession(group, instance string, s checkback.Session) error {
	_, err := b.register(&txmqv1.RegisterProducerRequest{ProducerGroup: group, InstanceId: instance}, checkback.Endpoint{Session: s})
	return err
}

// HeartbeatSession renews a registration made by RegisterSession.
func (b *Broker) HeartbeatSession(group, instance string, s checkback.Session) error {
	_, err := b.heartbeat(&txmqv1.HeartbeatRequest{ProducerGroup: group, InstanceId: instance}, checkback.Endpoint{Session: s})
	return err
}

// UnregisterSession forgets a registration made by RegisterSession (not
// one the instance made since on another endpoint).
func (b *Broker) UnregisterSession(group, instance string, s checkback.Session) {
	if b.checks.Registry().Unregister(group, instance, checkback.Endpoint{Session: s}) {
		b.log.Info("producer unregistered: its connection ended", "group", group, "instance", instance)
	}
}

// HeartbeatInterval is how often a session's registration must be renewed.
func (b *Broker) HeartbeatInterval() time.Duration { return b.checks.Config().HeartbeatInterval }

// Barrier waits until this leader's store holds every committed entry.
func (b *Broker) Barrier(ctx context.Context) error { return b.node.Barrier(ctx) }
