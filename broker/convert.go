package broker

import (
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore/storepb"
)

func ts(unixNano int64) *timestamppb.Timestamp {
	if unixNano == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, unixNano))
}

// The store's enums have the same numbers as the API's.
func halfState(s storepb.HalfState) txmqv1.HalfState { return txmqv1.HalfState(s) }

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
		ResolutionSource: txmqv1.ResolutionSource(h.ResolutionSource),
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
