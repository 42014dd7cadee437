package main

import (
	"encoding/base64"
	"unicode/utf8"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// The JSON records of -o json, one type per thing printed.

// JSON output: one object per line. Field names are the proto field names,
// except that the ID of the thing an object describes (a message, a
// node) is "id", a topic's name is "topic" as everywhere else, and a body
// is "body" (text, when it is valid UTF-8) or "body_base64" (anything
// else), absent where the record does not carry its body. Times are RFC 3339 in UTC,
// and absent when unset. Durations are Go duration strings ("6s", "1m0s"),
// and absent when unset. Enum values drop their prefix: "PENDING", not
// "HALF_STATE_PENDING".

// jsonBody holds exactly one of body and body_base64.
type jsonBody struct {
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
}

// newSizedJSONBody is newJSONBody for a record that says its body's size
// too: a body the record does not carry (a resolved half message keeps
// none) is absent, rather than an empty body beside a body_size above 0.
func newSizedJSONBody(b []byte, size uint32) jsonBody {
	if len(b) == 0 && size > 0 {
		return jsonBody{}
	}
	return newJSONBody(b)
}

func newJSONBody(b []byte) jsonBody {
	if utf8.Valid(b) {
		s := string(b)
		return jsonBody{Body: &s}
	}
	return jsonBody{BodyBase64: base64.StdEncoding.EncodeToString(b)}
}

type sendJSON struct {
	ID        string `json:"id"`
	Sequence  uint64 `json:"sequence"`
	Duplicate bool   `json:"duplicate"`
}

type halfSendJSON struct {
	ID        string `json:"id"`
	Duplicate bool   `json:"duplicate"`
	State     string `json:"state"`
}

type halfJSON struct {
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	ProducerGroup string            `json:"producer_group"`
	TransactionID string            `json:"transaction_id"`
	Key           string            `json:"key"`
	Properties    map[string]string `json:"properties"`
	jsonBody
	BodySize         uint32 `json:"body_size"`
	State            string `json:"state"`
	CreatedAt        string `json:"created_at,omitempty"`
	ResolvedAt       string `json:"resolved_at,omitempty"`
	ResolutionSource string `json:"resolution_source,omitempty"`
	Sequence         uint64 `json:"sequence"`
	CheckAttempts    uint32 `json:"check_attempts"`
	NextCheckAt      string `json:"next_check_at,omitempty"`
	LastCheckError   string `json:"last_check_error,omitempty"`
}

func newHalfJSON(m *txmqv1.HalfMessage) halfJSON {
	return halfJSON{
		ID:               m.GetMessageId(),
		Topic:            m.GetTopic(),
		ProducerGroup:    m.GetProducerGroup(),
		TransactionID:    m.GetTransactionId(),
		Key:              m.GetKey(),
		Properties:       nonNil(m.GetProperties()),
		jsonBody:         newSizedJSONBody(m.GetBody(), m.GetBodySize()),
		BodySize:         m.GetBodySize(),
		State:            stateName(m.GetState()),
		CreatedAt:        jsonTime(m.GetCreatedAt()),
		ResolvedAt:       jsonTime(m.GetResolvedAt()),
		ResolutionSource: sourceName(m.GetResolutionSource()),
		Sequence:         m.GetSequence(),
		CheckAttempts:    m.GetCheckAttempts(),
		NextCheckAt:      jsonTime(m.GetNextCheckAt()),
		LastCheckError:   m.GetLastCheckError(),
	}
}

type deliveryJSON struct {
	ID         string            `json:"id"`
	Topic      string            `json:"topic"`
	Key        string            `json:"key"`
	Properties map[string]string `json:"properties"`
	jsonBody
	Attempt       uint32 `json:"attempt"`
	Sequence      uint64 `json:"sequence"`
	CommittedAt   string `json:"committed_at,omitempty"`
	ProducerGroup string `json:"producer_group,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
	OrderingKey   string `json:"ordering_key,omitempty"`
	AckDeadline   string `json:"ack_deadline,omitempty"`
	LastError     string `json:"last_error,omitempty"`
}

func newDeliveryJSON(d *txmqv1.Delivery) deliveryJSON {
	return deliveryJSON{
		ID:            d.GetMessageId(),
		Topic:         d.GetTopic(),
		Key:           d.GetKey(),
		Properties:    nonNil(d.GetProperties()),
		jsonBody:      newJSONBody(d.GetBody()),
		Attempt:       d.GetAttempt(),
		Sequence:      d.GetSequence(),
		CommittedAt:   jsonTime(d.GetCommittedAt()),
		ProducerGroup: d.GetProducerGroup(),
		TransactionID: d.GetTransactionId(),
		OrderingKey:   d.GetOrderingKey(),
		AckDeadline:   jsonTime(d.GetAckDeadline()),
		LastError:     d.GetLastError(),
	}
}

type topicJSON struct {
	Topic          string   `json:"topic"`
	CreatedAt      string   `json:"created_at,omitempty"`
	FirstSequence  uint64   `json:"first_sequence"`
	LastSequence   uint64   `json:"last_sequence"`
	Messages       uint64   `json:"messages"`
	Bytes          uint64   `json:"bytes"`
	ConsumerGroups []string `json:"consumer_groups"`
}

func newTopicJSON(t *txmqv1.Topic) topicJSON {
	return topicJSON{
		Topic:          t.GetName(),
		CreatedAt:      jsonTime(t.GetCreatedAt()),
		FirstSequence:  t.GetFirstSequence(),
		LastSequence:   t.GetLastSequence(),
		Messages:       t.GetMessages(),
		Bytes:          t.GetBytes(),
		ConsumerGroups: append([]string{}, t.GetConsumerGroups()...),
	}
}

type topicCreateJSON struct {
	topicJSON
	Created bool `json:"created"`
}

type groupJSON struct {
	ConsumerGroup string           `json:"consumer_group"`
	Topics        []groupTopicJSON `json:"topics"`
	// Config is absent when the broker sent none.
	Config *consumerConfigJSON `json:"config,omitempty"`
	// Members only with --members.
	Members []memberJSON `json:"members,omitempty"`
}

type groupTopicJSON struct {
	Topic           string `json:"topic"`
	AckedThrough    uint64 `json:"acked_through"`
	AckedAbove      uint64 `json:"acked_above"`
	FirstSequence   uint64 `json:"first_sequence"`
	LastSequence    uint64 `json:"last_sequence"`
	Lag             uint64 `json:"lag"`
	OldestUnackedAt string `json:"oldest_unacked_at,omitempty"`
	LagAge          string `json:"lag_age,omitempty"`
	InFlight        uint32 `json:"in_flight"`
	Redeliveries    uint64 `json:"redeliveries"`
	Retrying        uint64 `json:"retrying"`
	DeadLetters     uint64 `json:"dead_letters"`
	Dropped         uint64 `json:"dropped"`
	Subscribers     uint32 `json:"subscribers"`
	CreatedAt       string `json:"created_at,omitempty"`
	AutoCreated     bool   `json:"auto_created,omitempty"`
}

func newGroupTopicJSON(t *txmqv1.GroupTopicStatus) groupTopicJSON {
	return groupTopicJSON{
		Topic:           t.GetTopic(),
		AckedThrough:    t.GetAckedThrough(),
		AckedAbove:      t.GetAckedAbove(),
		FirstSequence:   t.GetFirstSequence(),
		LastSequence:    t.GetLastSequence(),
		Lag:             t.GetLag(),
		OldestUnackedAt: jsonTime(t.GetOldestUnackedAt()),
		LagAge:          jsonDuration(t.GetLagAge()),
		InFlight:        t.GetInFlight(),
		Redeliveries:    t.GetRedeliveries(),
		Retrying:        t.GetRetrying(),
		DeadLetters:     t.GetDeadLetters(),
		Dropped:         t.GetDropped(),
		Subscribers:     t.GetSubscribers(),
		CreatedAt:       jsonTime(t.GetCreatedAt()),
		AutoCreated:     t.GetAutoCreated(),
	}
}

// topicDeleteJSON is what topic delete drops (or, dry_run, would drop).
type topicDeleteJSON struct {
	Topic               topicJSON      `json:"topic"`
	Groups              []groupRowJSON `json:"groups"`
	PendingHalfMessages uint64         `json:"pending_half_messages"`
	DryRun              bool           `json:"dry_run"`
}

// groupDeleteJSON is what group delete drops (or, dry_run, would drop).
type groupDeleteJSON struct {
	ConsumerGroup string         `json:"consumer_group"`
	Topics        []groupRowJSON `json:"topics"`
	Policy        bool           `json:"policy"`
	DryRun        bool           `json:"dry_run"`
}

type groupCreateJSON struct {
	groupRowJSON
	Created bool `json:"created"`
}

// memberJSON is one subscriber of a consumer group.
type memberJSON struct {
	Topic       string `json:"topic"`
	ClientID    string `json:"client_id"`
	Address     string `json:"address"`
	InFlight    uint32 `json:"in_flight"`
	MaxInFlight uint32 `json:"max_in_flight"`
	ConnectedAt string `json:"connected_at,omitempty"`
}

func newMemberJSON(m *txmqv1.GroupMember) memberJSON {
	return memberJSON{
		Topic:       m.GetTopic(),
		ClientID:    m.GetClientId(),
		Address:     m.GetAddress(),
		InFlight:    m.GetInFlight(),
		MaxInFlight: m.GetMaxInFlight(),
		ConnectedAt: jsonTime(m.GetConnectedAt()),
	}
}

// groupRowJSON is a line of group list: a group's progress on one topic.
type groupRowJSON struct {
	ConsumerGroup string `json:"consumer_group"`
	groupTopicJSON
}

// consumerConfigJSON leaves out what the broker left unset, like
// groupConfigJSON.
type consumerConfigJSON struct {
	ConsumerGroup     string   `json:"consumer_group"`
	MaxDeliveries     *uint32  `json:"max_deliveries,omitempty"`
	AckDeadline       string   `json:"ack_deadline,omitempty"`
	RedeliveryBackoff []string `json:"redelivery_backoff,omitempty"`
	OrderedPoison     string   `json:"ordered_poison,omitempty"`
}

func newConsumerConfigJSON(cfg *txmqv1.ConsumerGroupConfig) consumerConfigJSON {
	var backoff []string
	for _, d := range cfg.GetRedeliveryBackoff() {
		backoff = append(backoff, jsonDuration(d))
	}
	var maxDeliveries *uint32
	if cfg != nil {
		maxDeliveries = cfg.MaxDeliveries
	}
	return consumerConfigJSON{
		ConsumerGroup:     cfg.GetConsumerGroup(),
		MaxDeliveries:     maxDeliveries,
		AckDeadline:       jsonDuration(cfg.GetAckDeadline()),
		RedeliveryBackoff: backoff,
		OrderedPoison:     poisonName(cfg.GetOrderedPoison()),
	}
}

type resetJSON struct {
	ConsumerGroup   string `json:"consumer_group"`
	Topic           string `json:"topic"`
	OldAckedThrough uint64 `json:"old_acked_through"`
	NewAckedThrough uint64 `json:"new_acked_through"`
	LagBefore       uint64 `json:"lag_before"`
	LagAfter        uint64 `json:"lag_after"`
	DryRun          bool   `json:"dry_run"`
}

// deadLetterJSON holds the body only when it was asked for (dlq show):
// ListDeadLetters sends none.
type deadLetterJSON struct {
	ConsumerGroup string            `json:"consumer_group"`
	Topic         string            `json:"topic"`
	ID            string            `json:"id"`
	Sequence      uint64            `json:"sequence"`
	Attempts      uint32            `json:"attempts"`
	LastError     string            `json:"last_error,omitempty"`
	DeadAt        string            `json:"dead_at,omitempty"`
	CommittedAt   string            `json:"committed_at,omitempty"`
	Key           string            `json:"key"`
	OrderingKey   string            `json:"ordering_key"`
	Properties    map[string]string `json:"properties"`
	*jsonBody
	BodySize      uint32 `json:"body_size"`
	ProducerGroup string `json:"producer_group,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
}

func newDeadLetterJSON(dl *txmqv1.DeadLetter, withBody bool) deadLetterJSON {
	out := deadLetterJSON{
		ConsumerGroup: dl.GetConsumerGroup(),
		Topic:         dl.GetTopic(),
		ID:            dl.GetMessageId(),
		Sequence:      dl.GetSequence(),
		Attempts:      dl.GetAttempts(),
		LastError:     dl.GetLastError(),
		DeadAt:        jsonTime(dl.GetDeadAt()),
		CommittedAt:   jsonTime(dl.GetCommittedAt()),
		Key:           dl.GetKey(),
		OrderingKey:   dl.GetOrderingKey(),
		Properties:    nonNil(dl.GetProperties()),
		BodySize:      dl.GetBodySize(),
		ProducerGroup: dl.GetProducerGroup(),
		TransactionID: dl.GetTransactionId(),
	}
	if withBody {
		b := newJSONBody(dl.GetBody())
		out.jsonBody = &b
	}
	return out
}

type redriveJSON struct {
	ConsumerGroup string `json:"consumer_group"`
	Redriven      uint64 `json:"redriven"`
}

type purgeJSON struct {
	ConsumerGroup string `json:"consumer_group"`
	Purged        uint64 `json:"purged"`
	// With dry_run, the dead letters that would be purged.
	DryRun      bool             `json:"dry_run,omitempty"`
	DeadLetters []deadLetterJSON `json:"dead_letters,omitempty"`
}

type halfCheckJSON struct {
	Answer     string    `json:"answer,omitempty"`
	InstanceID string    `json:"instance_id"`
	Endpoint   string    `json:"endpoint"`
	Error      string    `json:"error,omitempty"`
	Message    *halfJSON `json:"message,omitempty"`
}

func newHalfCheckJSON(resp *txmqv1.CheckHalfMessageResponse) halfCheckJSON {
	out := halfCheckJSON{
		Answer:     resolutionName(resp.GetAnswer()),
		InstanceID: resp.GetInstanceId(),
		Endpoint:   resp.GetEndpoint(),
		Error:      resp.GetError(),
	}
	if m := resp.GetMessage(); m != nil {
		hj := newHalfJSON(m)
		out.Message = &hj
	}
	return out
}

type producerJSON struct {
	ProducerGroup  string       `json:"producer_group"`
	InstanceID     string       `json:"instance_id"`
	Endpoint       endpointJSON `json:"endpoint"`
	RegisteredAt   string       `json:"registered_at,omitempty"`
	LastHeartbeat  string       `json:"last_heartbeat,omitempty"`
	LeaseExpiresAt string       `json:"lease_expires_at,omitempty"`
}

// endpointJSON holds at most one of grpc_address, http_url and session,
// like the CallbackEndpoint oneof.
type endpointJSON struct {
	GrpcAddress string `json:"grpc_address,omitempty"`
	HTTPURL     string `json:"http_url,omitempty"`
	Session     string `json:"session,omitempty"`
}

func newProducerJSON(p *txmqv1.ProducerInstance) producerJSON {
	return producerJSON{
		ProducerGroup: p.GetProducerGroup(),
		InstanceID:    p.GetInstanceId(),
		Endpoint: endpointJSON{
			GrpcAddress: p.GetEndpoint().GetGrpcAddress(),
			HTTPURL:     p.GetEndpoint().GetHttpUrl(),
			Session:     p.GetEndpoint().GetSession(),
		},
		RegisteredAt:   jsonTime(p.GetRegisteredAt()),
		LastHeartbeat:  jsonTime(p.GetLastHeartbeat()),
		LeaseExpiresAt: jsonTime(p.GetLeaseExpiresAt()),
	}
}

// groupConfigJSON leaves out what the broker left unset, so that a field is
// absent rather than a misleading zero.
type groupConfigJSON struct {
	ProducerGroup   string  `json:"producer_group"`
	MaxChecks       *uint32 `json:"max_checks,omitempty"`
	CheckBackoff    string  `json:"check_backoff,omitempty"`
	MaxCheckBackoff string  `json:"max_check_backoff,omitempty"`
	MaxHalfAge      string  `json:"max_half_age,omitempty"`
	ExpiryAction    string  `json:"expiry_action,omitempty"`
	CallbackURL     *string `json:"callback_url,omitempty"`
}

func newGroupConfigJSON(cfg *txmqv1.ProducerGroupConfig) groupConfigJSON {
	var maxChecks *uint32
	if cfg != nil {
		maxChecks = cfg.MaxChecks
	}
	return groupConfigJSON{
		ProducerGroup:   cfg.GetProducerGroup(),
		MaxChecks:       maxChecks,
		CheckBackoff:    jsonDuration(cfg.GetCheckBackoff()),
		MaxCheckBackoff: jsonDuration(cfg.GetMaxCheckBackoff()),
		MaxHalfAge:      jsonDuration(cfg.GetMaxHalfAge()),
		ExpiryAction:    expiryName(cfg.GetExpiryAction()),
		CallbackURL:     cfg.CallbackUrl,
	}
}

type clusterJSON struct {
	NodeID            string            `json:"node_id"`
	State             string            `json:"state"`
	LeaderID          string            `json:"leader_id"`
	LeaderRaftAddress string            `json:"leader_raft_address"`
	LeaderAddress     string            `json:"leader_address"`
	Term              uint64            `json:"term"`
	CommitIndex       uint64            `json:"commit_index"`
	AppliedIndex      uint64            `json:"applied_index"`
	LastLogIndex      uint64            `json:"last_log_index"`
	StoreAppliedIndex uint64            `json:"store_applied_index"`
	Nodes             []clusterNodeJSON `json:"nodes"`
}

type clusterNodeJSON struct {
	ID          string `json:"id"`
	RaftAddress string `json:"raft_address"`
	GrpcAddress string `json:"grpc_address"`
	Suffrage    string `json:"suffrage"`
	Leader      bool   `json:"leader"`
	// As the node answered when asked; reachable is false when it did not.
	Reachable    bool   `json:"reachable"`
	State        string `json:"state,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	Lag          uint64 `json:"lag"`
}

type clusterJoinJSON struct {
	NodeID string `json:"node_id"`
	Added  bool   `json:"added"`
}

type clusterNodeIDJSON struct {
	NodeID string `json:"node_id"`
}

type clusterLeaderJSON struct {
	LeaderID string `json:"leader_id"`
}

type snapshotJSON struct {
	Index uint64 `json:"index"`
}

type topicMessageJSON struct {
	ID          string            `json:"id"`
	Topic       string            `json:"topic"`
	Sequence    uint64            `json:"sequence"`
	Key         string            `json:"key"`
	OrderingKey string            `json:"ordering_key,omitempty"`
	Properties  map[string]string `json:"properties"`
	jsonBody
	BodySize      uint32 `json:"body_size"`
	CommittedAt   string `json:"committed_at,omitempty"`
	ProducerGroup string `json:"producer_group,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
}

// newTopicMessageJSON is a committed message; without its body in
// listings (withBody false), which carry none.
func newTopicMessageJSON(m *txmqv1.TopicMessage, withBody bool) topicMessageJSON {
	out := topicMessageJSON{
		ID:            m.GetMessageId(),
		Topic:         m.GetTopic(),
		Sequence:      m.GetSequence(),
		Key:           m.GetKey(),
		OrderingKey:   m.GetOrderingKey(),
		Properties:    nonNil(m.GetProperties()),
		BodySize:      m.GetBodySize(),
		CommittedAt:   jsonTime(m.GetCommittedAt()),
		ProducerGroup: m.GetProducerGroup(),
		TransactionID: m.GetTransactionId(),
	}
	if withBody {
		out.jsonBody = newJSONBody(m.GetBody())
	}
	return out
}
