package rocketmq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/checkback"
)

var errNotALog = errors.New("rocketmq: not a topic log")

// callTimeout bounds one write into txmq on behalf of a client (the
// client's own send timeout is 3 s by default; it retries).
const callTimeout = 10 * time.Second

// sendHeader is a SEND_MESSAGE header, in the long (code 10) or the short
// (codes 310, 320) spelling.
type sendHeader struct {
	group, topic string
	sysFlag      int64
	props        map[string]string
	batch        bool
}

func parseSend(req *command) (sendHeader, error) {
	h := sendHeader{
		group: req.field("producerGroup", "a"),
		topic: req.field("topic", "b"),
		props: decodeProperties(req.field("properties", "i")),
		batch: req.Code == reqSendBatchMessage,
	}
	var err error
	if h.sysFlag, err = req.intField(0, "sysFlag", "f"); err != nil {
		return h, err
	}
	if h.topic == "" {
		return h, fmt.Errorf("the send names no topic")
	}
	return h, nil
}

func (s *Server) sendMessage(c *conn, req *command) *command {
	h, err := parseSend(req)
	if err != nil {
		return fail(codeMessageIllegal, err.Error())
	}
	body := req.Body
	if h.sysFlag&sysCompressed != 0 {
		if body, err = inflate(body, s.cfg.Broker.MaxMessageSize()); err != nil {
			return fail(codeMessageIllegal, err.Error())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if h.sysFlag&sysTranMask == sysTranPrepared {
		return s.sendHalf(ctx, c, h, body)
	}
	items := []batchItem{{body: body, props: h.props}}
	if h.batch {
		if items, err = decodeBatch(body); err != nil {
			return fail(codeMessageIllegal, err.Error())
		}
	}
	var ids []string
	var first uint64
	for _, it := range items {
		r, err := s.send(ctx, h.topic, it)
		if err != nil {
			return s.refusal(err)
		}
		if first == 0 {
			first = r.Sequence
		}
		ids = append(ids, offsetMsgID(s.host, int64(r.Sequence)))
	}
	q, off := s.position(first)
	return ok(map[string]string{
		"msgId": strings.Join(ids, ","), "queueId": strconv.Itoa(q), "queueOffset": strconv.FormatInt(off, 10),
	}, nil)
}

// send stores one message. A send to a retry topic (a client's fallback
// when CONSUMER_SEND_MSG_BACK failed) is held back by its DELAY level.
func (s *Server) send(ctx context.Context, topic string, it batchItem) (*txmqv1.SendResponse, error) {
	name, ok := storeTopic(topic)
	if !ok {
		return nil, fmt.Errorf("%w: topic %s is txmq's dead-letter queue, not a log: brokerctl dlq reads it", errNotALog, topic)
	}
	req := &txmqv1.SendRequest{Topic: name, Key: it.props[propUniqKey], Properties: it.props, Body: it.body}
	if !isRetryTopic(topic) {
		return s.cfg.Broker.Producer().Send(ctx, req)
	}
	// A copy given back again carries the same UNIQ_KEY: no dedup key.
	req.Key = ""
	level, _ := strconv.Atoi(it.props[propDelay])
	it.props[propDeliverAt] = strconv.FormatInt(s.cfg.Broker.Now().Add(delayOf(level)).UnixMilli(), 10)
	return s.cfg.Broker.SendReserved(ctx, req)
}

// sendHalf stores a prepared (half) message: the producer group from the
// request, the transaction ID the client's UNIQ_KEY, which is what its
// END_TRANSACTION and check-back answers name.
func (s *Server) sendHalf(ctx context.Context, c *conn, h sendHeader, body []byte) *command {
	group := h.props[propProducerGroup]
	if group == "" {
		group = h.group
	}
	txID := h.props[propUniqKey]
	if txID == "" {
		return fail(codeMessageIllegal, "a transactional message without UNIQ_KEY: txmq takes it as the transaction ID")
	}
	if !c.hasProducer(group) {
		c.registerProducer(group)
	}
	r, err := s.cfg.Broker.Producer().SendHalf(ctx, &txmqv1.SendHalfRequest{
		Topic: h.topic, ProducerGroup: group, TransactionId: txID, Properties: h.props, Body: body,
	})
	if err != nil {
		return s.refusal(err)
	}
	return ok(map[string]string{
		"msgId": offsetMsgID(s.host, 0), "queueId": "0", "queueOffset": "0", "transactionId": txID,
		"txmqMessageId": r.MessageId,
	}, nil)
}

// Transaction states of END_TRANSACTION's commitOrRollback.
const (
	tranCommit   = 0x2 << 2
	tranRollback = 0x3 << 2
)

// endTransaction applies END_TRANSACTION (one-way: nothing answers it).
// The answer to a check-back goes to the check waiting for it, which
// proposes it as a check-back's resolution; any other commit or rollback
// is the producer's own.
func (s *Server) endTransaction(c *conn, req *command) {
	txID, group := req.field("transactionId"), req.field("producerGroup")
	state, err := req.intField(0, "commitOrRollback")
	if err != nil || txID == "" {
		s.log.Warn("END_TRANSACTION ignored", "peer", c.peer, "tx_id", txID, "err", err)
		return
	}
	if req.field("fromTransactionCheck") == "true" && c.answerCheck(txID, int(state)) {
		return
	}
	res := txmqv1.Resolution_RESOLUTION_COMMIT
	switch state {
	case tranCommit:
	case tranRollback:
		res = txmqv1.Resolution_RESOLUTION_ROLLBACK
	default:
		return // UNKNOWN: txmq's check-back asks later
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	_, err = s.cfg.Broker.Producer().EndTransaction(ctx, &txmqv1.EndTransactionRequest{
		Target: &txmqv1.EndTransactionRequest_Transaction{Transaction: &txmqv1.TransactionRef{
			ProducerGroup: group, TransactionId: txID,
		}},
		Resolution: res,
	})
	if err != nil {
		s.log.Warn("END_TRANSACTION refused", "peer", c.peer, "group", group, "tx_id", txID, "err", err)
	}
}

// refusal is a txmq error as a RocketMQ answer: "not the leader" and "no
// quorum" are SERVICE_NOT_AVAILABLE (the client retries elsewhere), bad
// input MESSAGE_ILLEGAL, the rest SYSTEM_ERROR; the remark is txmq's.
func (s *Server) refusal(err error) *command {
	if errors.Is(err, errNotALog) {
		return fail(codeNoPermission, err.Error())
	}
	st := status.Convert(s.cfg.Broker.StatusOf(err))
	switch st.Code() {
	case codes.Unavailable:
		return fail(codeServiceUnavailable, st.Message())
	case codes.InvalidArgument, codes.ResourceExhausted:
		return fail(codeMessageIllegal, st.Message())
	case codes.NotFound:
		return fail(codeTopicNotExist, st.Message())
	}
	return fail(codeSystemError, st.Message())
}

// Check implements checkback.Session: CHECK_TRANSACTION_STATE goes down
// the connection with the half message in the stored-message format; the
// client answers with a one-way END_TRANSACTION (fromTransactionCheck).
// A check that could not be written did not reach the producer.
func (c *conn) Check(ctx context.Context, req *txmqv1.CheckTransactionRequest) (txmqv1.Resolution, error) {
	answer, done := c.awaitCheck(req.TransactionId)
	defer done()
	props := map[string]string{}
	for k, v := range req.Properties {
		props[k] = v
	}
	props[propProducerGroup] = req.ProducerGroup
	props[propUniqKey] = req.TransactionId
	props[propTranMsg] = "true"
	props[propTransactionID] = req.TransactionId
	at := req.CreatedAt.AsTime().UnixMilli()
	body := appendStored(nil, &stored{
		topic: req.Topic, sysFlag: sysTranPrepared, bornAt: at, at: at, host: c.s.host, body: req.Body, props: props,
	})
	ext := map[string]string{
		"tranStateTableOffset": "0", "commitLogOffset": "0", "msgId": req.TransactionId,
		"transactionId": req.TransactionId, "offsetMsgId": offsetMsgID(c.s.host, 0),
	}
	if err := c.request(reqCheckTransaction, ext, body); err != nil {
		return 0, fmt.Errorf("%w: %w", checkback.ErrNotReached, err)
	}
	select {
	case state := <-answer:
		switch state {
		case tranCommit:
			return txmqv1.Resolution_RESOLUTION_COMMIT, nil
		case tranRollback:
			return txmqv1.Resolution_RESOLUTION_ROLLBACK, nil
		}
		return txmqv1.Resolution_RESOLUTION_UNKNOWN, nil
	case <-c.done:
		return 0, fmt.Errorf("%w: the connection of %s ended before the producer answered", checkback.ErrNotReached, c.peer)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
