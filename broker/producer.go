package broker

import (
	"context"
	"fmt"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type producerService struct {
	txmqv1.UnimplementedProducerServiceServer
	b *Broker
}

func (s *producerService) Send(ctx context.Context, req *txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
	b := s.b
	if err := checkTopic(req.Topic); err != nil {
		return nil, err
	}
	if err := b.checkMessage(req.Key, req.OrderingKey, req.Properties, req.Body); err != nil {
		return nil, err
	}
	now := b.cfg.Now()
	id := b.ids.next(now)
	r, err := b.node.Propose(ctx, &raftpb.Command{Now: now.UnixNano(), Op: &raftpb.Command_Send{Send: &raftpb.Send{
		Topic:       req.Topic,
		MessageId:   id,
		Key:         req.Key,
		OrderingKey: req.OrderingKey,
		Properties:  req.Properties,
		Body:        req.Body,
		CreateTopic: *b.cfg.AutoCreateTopics,
		DedupWindow: int64(b.cfg.DedupWindow),
	}}})
	if err != nil {
		return nil, b.toStatus(err)
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
	if req.CheckAfter != nil {
		if err := req.CheckAfter.CheckValid(); err != nil {
			return nil, invalid("check_after: " + err.Error())
		}
		checkAfter = req.CheckAfter.AsDuration()
		if checkAfter < MinCheckAfter || checkAfter > MaxCheckAfter {
			return nil, invalid(fmt.Sprintf("check_after %s is outside %s..%s", checkAfter, MinCheckAfter, MaxCheckAfter))
		}
	}
	now := b.cfg.Now()
	id := b.ids.next(now)
	r, err := b.node.Propose(ctx, &raftpb.Command{Now: now.UnixNano(), Op: &raftpb.Command_SendHalf{SendHalf: &raftpb.SendHalf{
		Topic:         req.Topic,
		MessageId:     id,
		ProducerGroup: req.ProducerGroup,
		TransactionId: req.TransactionId,
		Key:           req.Key,
		OrderingKey:   req.OrderingKey,
		Properties:    req.Properties,
		Body:          req.Body,
		CreateTopic:   *b.cfg.AutoCreateTopics,
		CheckAfter:    int64(checkAfter),
	}}})
	if err != nil {
		return nil, b.toStatus(err)
	}
	b.log.Info("half message stored", "msg_id", r.MessageID, "tx_id", req.TransactionId,
		"producer_group", req.ProducerGroup, "topic", req.Topic, "duplicate", r.Duplicate)
	return &txmqv1.SendHalfResponse{MessageId: r.MessageID, Duplicate: r.Duplicate, State: halfState(r.Half.State)}, nil
}

func (s *producerService) EndTransaction(ctx context.Context, req *txmqv1.EndTransactionRequest) (*txmqv1.EndTransactionResponse, error) {
	op := &raftpb.Resolve{Source: raftpb.Source_SOURCE_PRODUCER}
	switch t := req.Target.(type) {
	case *txmqv1.EndTransactionRequest_MessageId:
		if t.MessageId == "" {
			return nil, invalid("message_id is empty")
		}
		op.MessageId = t.MessageId
	case *txmqv1.EndTransactionRequest_Transaction:
		if t.Transaction == nil {
			return nil, invalid("transaction is empty")
		}
		if err := checkName("producer_group", t.Transaction.ProducerGroup); err != nil {
			return nil, err
		}
		if err := checkTxID(t.Transaction.TransactionId); err != nil {
			return nil, err
		}
		op.ProducerGroup, op.TransactionId = t.Transaction.ProducerGroup, t.Transaction.TransactionId
	default:
		return nil, invalid("name the half message by message_id or by transaction (producer_group + transaction_id)")
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
	switch res {
	case txmqv1.Resolution_RESOLUTION_COMMIT:
		op.Resolution = raftpb.Resolution_RESOLUTION_COMMIT
	case txmqv1.Resolution_RESOLUTION_ROLLBACK:
		op.Resolution = raftpb.Resolution_RESOLUTION_ROLLBACK
	default:
		return nil, invalid("resolution must be COMMIT or ROLLBACK")
	}
	r, err := b.node.Propose(ctx, &raftpb.Command{Now: b.now(), Op: &raftpb.Command_Resolve{Resolve: op}})
	if err != nil {
		return nil, b.toStatus(err)
	}
	h := r.Half
	b.log.Info("half message resolved", "msg_id", h.Id, "tx_id", h.TransactionId, "producer_group", h.ProducerGroup,
		"topic", h.Topic, "state", stateLabel(h.State), "source", sourceLabel(storepb.Source(op.Source)), "seq", h.Sequence, "duplicate", r.Duplicate)
	return halfToAPI(h), nil
}
