package broker

import (
	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
)

// needsOf says what one request needs. For a stream, it is called on
// every request received.
type needsOf func(a *authorizer, req any) ([]need, error)

// methodNeeds is the one table of what each RPC needs: the action and
// the resources, taken from the request. An RPC of ours that is not here
// is refused to everyone (a test checks that every one is).
var methodNeeds = map[string]needsOf{
	producerMethod("Send"): on(func(_ *authorizer, r *txmqv1.SendRequest) []need {
		return []need{topicNeed(actPublish, r.Topic)}
	}),
	producerMethod("SendHalf"): on(func(_ *authorizer, r *txmqv1.SendHalfRequest) []need {
		return []need{topicNeed(actPublish, r.Topic), producerNeed(actTransact, r.ProducerGroup)}
	}),
	producerMethod("EndTransaction"): on(func(a *authorizer, r *txmqv1.EndTransactionRequest) []need {
		return []need{producerNeed(actTransact, a.halfGroup(r.GetMessageId(), r.GetTransaction()))}
	}),
	producerMethod("RegisterProducer"): on(func(_ *authorizer, r *txmqv1.RegisterProducerRequest) []need {
		return []need{producerNeed(actTransact, r.ProducerGroup)}
	}),
	producerMethod("Heartbeat"): on(func(_ *authorizer, r *txmqv1.HeartbeatRequest) []need {
		return []need{producerNeed(actTransact, r.ProducerGroup)}
	}),
	"/txmq.v1.ConsumerService/Subscribe": subscribeNeeds,

	adminMethod("ClusterStatus"):      clusterNeed(actAdminRead),
	adminMethod("GetStats"):           clusterNeed(actAdminRead),
	adminMethod("JoinCluster"):        clusterNeed(actAdminWrite),
	adminMethod("RemoveNode"):         clusterNeed(actAdminWrite),
	adminMethod("TransferLeadership"): clusterNeed(actAdminWrite),
	adminMethod("TakeSnapshot"):       clusterNeed(actAdminWrite),
	adminMethod("Clock"):              clusterNeed(actAdminRead),

	adminMethod("CreateTopic"): on(func(_ *authorizer, r *txmqv1.CreateTopicRequest) []need {
		return []need{topicNeed(actAdminWrite, r.Name)}
	}),
	adminMethod("DeleteTopic"): on(func(_ *authorizer, r *txmqv1.DeleteTopicRequest) []need {
		return []need{topicNeed(actAdminWrite, r.Name)}
	}),
	adminMethod("ListTopics"): on(func(_ *authorizer, _ *txmqv1.ListTopicsRequest) []need { return []need{topicNeed(actAdminRead, "")} }),
	adminMethod("GetMessage"): on(func(_ *authorizer, r *txmqv1.GetMessageRequest) []need {
		return []need{topicNeed(actAdminRead, r.Topic)}
	}),
	adminMethod("FindMessages"): on(func(_ *authorizer, r *txmqv1.FindMessagesRequest) []need {
		return []need{topicNeed(actAdminRead, r.Topic)}
	}),
	adminMethod("ReadMessages"): on(func(_ *authorizer, r *txmqv1.ReadMessagesRequest) []need {
		return []need{topicNeed(actAdminRead, r.Topic)}
	}),

	adminMethod("ListHalfMessages"): on(func(_ *authorizer, r *txmqv1.ListHalfMessagesRequest) []need {
		return []need{producerNeed(actAdminRead, r.ProducerGroup)}
	}),
	adminMethod("GetHalfMessage"): on(func(a *authorizer, r *txmqv1.GetHalfMessageRequest) []need {
		return []need{producerNeed(actAdminRead, a.halfGroup(r.MessageId, r.Transaction))}
	}),
	adminMethod("ResolveHalfMessage"): on(func(a *authorizer, r *txmqv1.ResolveHalfMessageRequest) []need {
		return []need{producerNeed(actAdminWrite, a.halfGroup(r.MessageId, r.Transaction))}
	}),
	adminMethod("CheckHalfMessage"): on(func(a *authorizer, r *txmqv1.CheckHalfMessageRequest) []need {
		return []need{producerNeed(actAdminWrite, a.halfGroup(r.MessageId, nil))}
	}),
	adminMethod("ListProducers"): on(func(_ *authorizer, r *txmqv1.ListProducersRequest) []need {
		return []need{producerNeed(actAdminRead, r.ProducerGroup)}
	}),
	adminMethod("GetProducerGroupConfig"): on(func(_ *authorizer, r *txmqv1.GetProducerGroupConfigRequest) []need {
		return []need{producerNeed(actAdminRead, r.ProducerGroup)}
	}),
	adminMethod("SetProducerGroupConfig"): on(func(_ *authorizer, r *txmqv1.SetProducerGroupConfigRequest) []need {
		return []need{producerNeed(actAdminWrite, r.GetConfig().GetProducerGroup())}
	}),

	adminMethod("DescribeConsumerGroup"): on(func(_ *authorizer, r *txmqv1.DescribeConsumerGroupRequest) []need {
		return []need{consumerNeed(actAdminRead, r.ConsumerGroup)}
	}),
	adminMethod("ListConsumerGroups"): on(func(_ *authorizer, _ *txmqv1.ListConsumerGroupsRequest) []need {
		return []need{consumerNeed(actAdminRead, "")}
	}),
	adminMethod("CreateConsumerGroup"): on(func(_ *authorizer, r *txmqv1.CreateConsumerGroupRequest) []need {
		return []need{consumerNeed(actAdminWrite, r.ConsumerGroup)}
	}),
	adminMethod("DeleteConsumerGroup"): on(func(_ *authorizer, r *txmqv1.DeleteConsumerGroupRequest) []need {
		return []need{consumerNeed(actAdminWrite, r.ConsumerGroup)}
	}),
	adminMethod("GetConsumerGroupConfig"): on(func(_ *authorizer, r *txmqv1.GetConsumerGroupConfigRequest) []need {
		return []need{consumerNeed(actAdminRead, r.ConsumerGroup)}
	}),
	adminMethod("SetConsumerGroupConfig"): on(func(_ *authorizer, r *txmqv1.SetConsumerGroupConfigRequest) []need {
		return []need{consumerNeed(actAdminWrite, r.GetConfig().GetConsumerGroup())}
	}),
	adminMethod("ResetConsumerGroup"): on(func(_ *authorizer, r *txmqv1.ResetConsumerGroupRequest) []need {
		return []need{consumerNeed(actAdminWrite, r.ConsumerGroup)}
	}),
	adminMethod("ListDeadLetters"): on(func(_ *authorizer, r *txmqv1.ListDeadLettersRequest) []need {
		return []need{consumerNeed(actAdminRead, r.ConsumerGroup)}
	}),
	adminMethod("GetDeadLetter"): on(func(_ *authorizer, r *txmqv1.GetDeadLetterRequest) []need {
		return []need{consumerNeed(actAdminRead, r.ConsumerGroup)}
	}),
	adminMethod("RedriveDeadLetters"): on(func(_ *authorizer, r *txmqv1.RedriveDeadLettersRequest) []need {
		return []need{consumerNeed(actAdminWrite, r.ConsumerGroup)}
	}),
	adminMethod("PurgeDeadLetters"): on(func(_ *authorizer, r *txmqv1.PurgeDeadLettersRequest) []need {
		return []need{consumerNeed(actAdminWrite, r.ConsumerGroup)}
	}),
}

// The session's entry looks the table up for each of its requests.
func init() { methodNeeds[producerMethod("Session")] = sessionNeeds }

func producerMethod(name string) string { return "/txmq.v1.ProducerService/" + name }
func adminMethod(name string) string    { return "/txmq.v1.AdminService/" + name }

// on adapts a function of one request type to the table; a request of
// another type cannot reach it (gRPC decodes by method).
func on[T any](f func(*authorizer, T) []need) needsOf {
	return func(a *authorizer, req any) ([]need, error) {
		r, ok := req.(T)
		if !ok {
			return nil, invalidf("unexpected request type %T", req)
		}
		return f(a, r), nil
	}
}

func clusterNeed(action string) needsOf {
	return func(*authorizer, any) ([]need, error) { return []need{{action: action, typ: resCluster}}, nil }
}

// A request without a name (a list of every topic or group) needs the
// action on "*": a rule on "orders.*" does not grant it.
func named(action, typ, name string) need {
	if name == "" {
		name = "*"
	}
	return need{action: action, typ: typ, name: name}
}

func topicNeed(action, name string) need    { return named(action, "topic", name) }
func producerNeed(action, name string) need { return named(action, "producer-group", name) }
func consumerNeed(action, name string) need { return named(action, "consumer-group", name) }

// halfGroup is the producer group of the half message a request names,
// by transaction or by ID (read from this node's store). An ID this node
// does not know needs the action on every producer group.
func (a *authorizer) halfGroup(id string, tr *txmqv1.TransactionRef) string {
	if tr != nil {
		return tr.ProducerGroup
	}
	group := ""
	_ = a.b.node.Store().View(func(tx *halfstore.Tx) error {
		if h, err := tx.Half(id); err == nil {
			group = h.ProducerGroup
		}
		return nil
	})
	return group
}

// sessionNeeds checks each request of a producer session as the unary
// call it stands for; answers to check-backs need nothing more (they
// answer the session's own checks).
func sessionNeeds(a *authorizer, req any) ([]need, error) {
	r, ok := req.(*txmqv1.SessionRequest)
	if !ok {
		return nil, invalidf("unexpected request type %T", req)
	}
	var inner any
	method := ""
	switch k := r.Kind.(type) {
	case *txmqv1.SessionRequest_Send:
		method, inner = "Send", k.Send
	case *txmqv1.SessionRequest_SendHalf:
		method, inner = "SendHalf", k.SendHalf
	case *txmqv1.SessionRequest_EndTransaction:
		method, inner = "EndTransaction", k.EndTransaction
	case *txmqv1.SessionRequest_Register:
		method, inner = "RegisterProducer", k.Register
	case *txmqv1.SessionRequest_Heartbeat:
		method, inner = "Heartbeat", k.Heartbeat
	default:
		return nil, nil
	}
	return methodNeeds[producerMethod(method)](a, inner)
}

// subscribeNeeds: a subscription needs subscribe on its topic and on its
// consumer group. Acks, nacks and extensions act on the stream's own
// group only, so they need nothing more: a consumer cannot settle another
// group's deliveries.
func subscribeNeeds(_ *authorizer, req any) ([]need, error) {
	r, ok := req.(*txmqv1.SubscribeRequest)
	if !ok {
		return nil, invalidf("unexpected request type %T", req)
	}
	start := r.GetStart()
	if start == nil {
		return nil, nil
	}
	return []need{topicNeed(actSubscribe, start.Topic), consumerNeed(actSubscribe, start.ConsumerGroup)}, nil
}
