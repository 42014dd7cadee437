package broker

import (
	"context"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/internal/bounds"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type producerService struct {
	txmqv1.UnimplementedProducerServiceServer
	b *Broker
}

func (s *producerService) Send(ctx context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
	if err := checkTopic(req.Topic); err != nil {
		return nil, err
	}
	return s.b.send(ctx, req)
}

// send stores a message in a topic whose name is checked already.
func (b *Broker) send(ctx context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
	if err := b.checkMessage(req.Key, req.OrderingKey, req.Properties, req.Body); err != nil {
		return nil, err
	}
	now := b.clock.Now()
	r, err := b.node.Send(ctx, now, &raftpb.Send{
		Topic:       req.Topic,
		MessageId:   b.ids.next(now),
		Key:         req.Key,
		OrderingKey: req.OrderingKey,
		Properties:  req.Properties,
		Body:        req.Body,
		CreateTopic: *b.cfg.AutoCreateTopics,
		DedupWindow: int64(b.cfg.DedupWindow),
	})
	if err != nil {
		return nil, err
	}
	b.log.Info("sent", "msg_id", r.MessageID, "topic", req.Topic, "seq", r.Sequence, "duplicate", r.Duplicate)
	return &txmqv1.SendResponse{MessageId: r.MessageID, Sequence: r.Sequence, Duplicate: r.Duplicate}, nil
}

func (s *producerService) SendHalf(ctx context.Context, req *txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
	b := s.b
	if err := checkTopic(req.Topic); err != nil {
		return nil, err
	}
	if err := checkName("producer_group", req.ProducerGroup); err != nil {
		return nil, err
	}
	if err := checkTxID(req.TransactionId); err != nil {
		return nil, err
	}
	if err := b.checkMessage(req.Key, req.OrderingKey, req.Properties, req.Body); err != nil {
		return nil, err
	}
	checkAfter := b.cfg.DefaultCheckAfter
	if d, err := optDuration("check_after", req.CheckAfter, bounds.CheckAfter); err != nil {
		return nil, err
	} else if d != nil {
		checkAfter = *d
	}
	now := b.clock.Now()
	r, err := b.node.SendHalf(ctx, now, &raftpb.SendHalf{
		Topic:         req.Topic,
		MessageId:     b.ids.next(now),
		ProducerGroup: req.ProducerGroup,
		TransactionId: req.TransactionId,
		Key:           req.Key,
		OrderingKey:   req.OrderingKey,
		Properties:    req.Properties,
		Body:          req.Body,
		CreateTopic:   *b.cfg.AutoCreateTopics,
		CheckAfter:    int64(checkAfter),
	})
	if err != nil {
		return nil, err
	}
	h := r.Half
	b.log.Info("half message stored", "msg_id", h.Id, "tx_id", req.TransactionId,
		"producer_group", req.ProducerGroup, "topic", req.Topic, "duplicate", !r.Changed)
	return &txmqv1.SendHalfResponse{MessageId: h.Id, Duplicate: !r.Changed, State: halfState(h.State)}, nil
}

func (s *producerService) EndTransaction(ctx context.Context, req *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
	op := &raftpb.Resolve{Source: storepb.Source_SOURCE_PRODUCER}
	switch t := req.Target.(type) {
	case *txmqv1.EndTransactionRequest_MessageId:
		if err := checkMessageID(t.MessageId); err != nil {
			return nil, err
		}
		op.MessageId = t.MessageId
	case *txmqv1.EndTransactionRequest_Transaction:
		if t.Transaction == nil {
			return nil, invalidf("transaction is empty")
		}
		if err := checkTransactionRef(t.Transaction); err != nil {
			return nil, err
		}
		op.ProducerGroup, op.TransactionId = t.Transaction.ProducerGroup, t.Transaction.TransactionId
	default:
		return nil, invalidf("name the half message by message_id or by transaction (producer_group + transaction_id)")
	}
	half, err := s.b.resolve(ctx, op, req.Resolution)
	if err != nil {
		return nil, err
	}
	return &txmqv1.EndTransactionResponse{MessageId: half.MessageId, State: half.State, Sequence: half.Sequence}, nil
}

// resolve proposes a commit or rollback and returns the message as it is
// afterwards.
func (b *Broker) resolve(ctx context.Context, op *raftpb.Resolve, res txmqv1.Resolution) (*txmqv1.HalfMessage, error) {
	var err error
	if op.Resolution, err = resolution(res); err != nil {
		return nil, err
	}
	r, err := b.node.Resolve(ctx, b.clock.Now(), op)
	if err != nil {
		return nil, err
	}
	h := r.Half
	b.log.Info("half message resolved", "msg_id", h.Id, "tx_id", h.TransactionId, "producer_group", h.ProducerGroup,
		"topic", h.Topic, "state", stateLabel(h.State), "source", sourceLabel(op.Source), "seq", h.Sequence, "duplicate", !r.Changed)
	return halfToAPI(h), nil
}
