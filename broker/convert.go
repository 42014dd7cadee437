package broker

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Conversions between the public API and the internal records, by name:
// the API and the disk format evolve apart, so no enum is cast by number.

func ts(unixNano int64) *timestamppb.Timestamp {
	if unixNano == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, unixNano))
}

func halfState(s storepb.HalfState) txmqv1.HalfState {
	switch s {
	case storepb.HalfState_HALF_STATE_PENDING:
		return txmqv1.HalfState_HALF_STATE_PENDING
	case storepb.HalfState_HALF_STATE_COMMITTED:
		return txmqv1.HalfState_HALF_STATE_COMMITTED
	case storepb.HalfState_HALF_STATE_ROLLED_BACK:
		return txmqv1.HalfState_HALF_STATE_ROLLED_BACK
	case storepb.HalfState_HALF_STATE_EXPIRED:
		return txmqv1.HalfState_HALF_STATE_EXPIRED
	}
	return txmqv1.HalfState_HALF_STATE_UNSPECIFIED
}

// storeHalfState is the store's state for an API filter; UNSPECIFIED
// matches every state.
func storeHalfState(s txmqv1.HalfState) (storepb.HalfState, error) {
	switch s {
	case txmqv1.HalfState_HALF_STATE_UNSPECIFIED:
		return storepb.HalfState_HALF_STATE_UNSPECIFIED, nil
	case txmqv1.HalfState_HALF_STATE_PENDING:
		return storepb.HalfState_HALF_STATE_PENDING, nil
	case txmqv1.HalfState_HALF_STATE_COMMITTED:
		return storepb.HalfState_HALF_STATE_COMMITTED, nil
	case txmqv1.HalfState_HALF_STATE_ROLLED_BACK:
		return storepb.HalfState_HALF_STATE_ROLLED_BACK, nil
	case txmqv1.HalfState_HALF_STATE_EXPIRED:
		return storepb.HalfState_HALF_STATE_EXPIRED, nil
	}
	return 0, invalidf("unknown half message state %d", s)
}

func resolutionSource(s storepb.Source) txmqv1.ResolutionSource {
	switch s {
	case storepb.Source_SOURCE_PRODUCER:
		return txmqv1.ResolutionSource_RESOLUTION_SOURCE_PRODUCER
	case storepb.Source_SOURCE_CHECKBACK:
		return txmqv1.ResolutionSource_RESOLUTION_SOURCE_CHECKBACK
	case storepb.Source_SOURCE_OPERATOR:
		return txmqv1.ResolutionSource_RESOLUTION_SOURCE_OPERATOR
	case storepb.Source_SOURCE_EXPIRY:
		return txmqv1.ResolutionSource_RESOLUTION_SOURCE_EXPIRY
	}
	return txmqv1.ResolutionSource_RESOLUTION_SOURCE_UNSPECIFIED
}

// resolution is the command's form of an API resolution: COMMIT or
// ROLLBACK; UNKNOWN resolves nothing and is refused.
func resolution(r txmqv1.Resolution) (raftpb.Resolution, error) {
	switch r {
	case txmqv1.Resolution_RESOLUTION_COMMIT:
		return raftpb.Resolution_RESOLUTION_COMMIT, nil
	case txmqv1.Resolution_RESOLUTION_ROLLBACK:
		return raftpb.Resolution_RESOLUTION_ROLLBACK, nil
	}
	return 0, invalidf("resolution must be COMMIT or ROLLBACK")
}

// expiryAction is the store's form of an API expiry action; UNSPECIFIED
// leaves it unset.
func expiryAction(a txmqv1.ExpiryAction) (*storepb.ExpiryAction, error) {
	var out storepb.ExpiryAction
	switch a {
	case txmqv1.ExpiryAction_EXPIRY_ACTION_UNSPECIFIED:
		return nil, nil
	case txmqv1.ExpiryAction_EXPIRY_ACTION_PARK:
		out = storepb.ExpiryAction_EXPIRY_ACTION_PARK
	case txmqv1.ExpiryAction_EXPIRY_ACTION_ROLLBACK:
		out = storepb.ExpiryAction_EXPIRY_ACTION_ROLLBACK
	default:
		return nil, invalidf("expiry_action must be PARK or ROLLBACK")
	}
	return &out, nil
}

// orderedPoison is the store's form of an API poison policy; UNSPECIFIED
// leaves it unset.
func orderedPoison(p txmqv1.OrderedPoison) (*storepb.OrderedPoison, error) {
	var out storepb.OrderedPoison
	switch p {
	case txmqv1.OrderedPoison_ORDERED_POISON_UNSPECIFIED:
		return nil, nil
	case txmqv1.OrderedPoison_ORDERED_POISON_SKIP:
		out = storepb.OrderedPoison_ORDERED_POISON_SKIP
	case txmqv1.OrderedPoison_ORDERED_POISON_HOLD:
		out = storepb.OrderedPoison_ORDERED_POISON_HOLD
	default:
		return nil, invalidf("ordered_poison %d is not SKIP or HOLD", p)
	}
	return &out, nil
}

// startPosition is the command's form of an API start position, with def
// standing for UNSPECIFIED (nil def: it is refused). A TIMESTAMP needs a
// time Unix nanoseconds can hold.
func startPosition(what string, p txmqv1.StartPosition, at *timestamppb.Timestamp, def *raftpb.StartPosition) (raftpb.StartPosition, int64, error) {
	switch p {
	case txmqv1.StartPosition_START_POSITION_UNSPECIFIED:
		if def == nil {
			return 0, 0, invalidf("%s is required: EARLIEST, LATEST or TIMESTAMP", what)
		}
		return *def, 0, nil
	case txmqv1.StartPosition_START_POSITION_EARLIEST:
		return raftpb.StartPosition_START_POSITION_EARLIEST, 0, nil
	case txmqv1.StartPosition_START_POSITION_LATEST:
		return raftpb.StartPosition_START_POSITION_LATEST, 0, nil
	case txmqv1.StartPosition_START_POSITION_TIMESTAMP:
		ns, err := startTime(what+" TIMESTAMP", at)
		return raftpb.StartPosition_START_POSITION_TIMESTAMP, ns, err
	}
	return 0, 0, invalidf("%s %d is not EARLIEST, LATEST or TIMESTAMP", what, p)
}

// startTime checks the time of a TIMESTAMP position: Unix nanoseconds hold
// 1970 to 2262.
func startTime(what string, at *timestamppb.Timestamp) (int64, error) {
	if at == nil || at.CheckValid() != nil {
		return 0, invalidf("%s needs a valid time", what)
	}
	t := at.AsTime()
	if t.Before(time.Unix(0, 0)) || t.After(time.Unix(0, maxUnixNano)) {
		return 0, invalidf("%s: %s is outside 1970..2262", what, t.Format(time.RFC3339))
	}
	return t.UnixNano(), nil
}

const maxUnixNano = 1<<63 - 1

func halfToAPI(h *storepb.Half) *txmqv1.HalfMessage {
	m := &txmqv1.HalfMessage{
		MessageId:        h.Id,
		Topic:            h.Topic,
		ProducerGroup:    h.ProducerGroup,
		TransactionId:    h.TransactionId,
		Key:              h.Key,
		Properties:       h.Properties,
		Body:             h.Body,
		BodySize:         h.BodySize,
		State:            halfState(h.State),
		CreatedAt:        ts(h.CreatedAt),
		ResolvedAt:       ts(h.ResolvedAt),
		ResolutionSource: resolutionSource(h.ResolutionSource),
		Sequence:         h.Sequence,
		CheckAttempts:    h.CheckAttempts,
		LastCheckError:   h.LastCheckError,
	}
	if h.State == storepb.HalfState_HALF_STATE_PENDING {
		m.NextCheckAt = ts(h.NextCheckAt)
	}
	return m
}

func deliveryOf(topic string, m *storepb.Message, attempt uint32) *txmqv1.Delivery {
	return &txmqv1.Delivery{
		MessageId:     m.Id,
		Topic:         topic,
		Key:           m.Key,
		Properties:    m.Properties,
		Body:          m.Body,
		Attempt:       attempt,
		CommittedAt:   ts(m.CommittedAt),
		Sequence:      m.Sequence,
		ProducerGroup: m.ProducerGroup,
		TransactionId: m.TransactionId,
		OrderingKey:   m.OrderingKey,
	}
}
