package rocketmq

import (
	"encoding/json"
	"strconv"
)

// Request codes (RocketMQ's RequestCode) this front end answers.
const (
	reqSendMessage            = 10
	reqPullMessage            = 11
	reqQueryConsumerOffset    = 14
	reqUpdateConsumerOff      = 15
	reqSearchOffsetByTime     = 29
	reqGetMaxOffset           = 30
	reqGetMinOffset           = 31
	reqHeartBeat              = 34
	reqUnregisterClient       = 35
	reqConsumerSendMsgBack    = 36
	reqEndTransaction         = 37
	reqGetConsumerList        = 38
	reqCheckTransaction       = 39
	reqNotifyConsumersChanged = 40
	reqGetRouteByTopic        = 105
	reqSendMessageV2          = 310
	reqSendBatchMessage       = 320

	version = 317
)

// handle answers one request; nil means no answer (END_TRANSACTION).
func (s *Server) handle(c *conn, req *command) *command {
	switch req.Code {
	case reqGetRouteByTopic:
		return s.route(req)
	case reqHeartBeat:
		return s.heartbeat(c, req)
	case reqSendMessage, reqSendMessageV2, reqSendBatchMessage:
		return s.sendMessage(c, req)
	case reqEndTransaction:
		s.endTransaction(c, req)
		return nil
	case reqGetConsumerList:
		return s.consumerList(req)
	case reqPullMessage:
		return s.pull(c, req)
	case reqQueryConsumerOffset:
		return s.queryConsumerOffset(req)
	case reqUpdateConsumerOff:
		return s.updateConsumerOffset(req)
	case reqGetMaxOffset, reqGetMinOffset, reqSearchOffsetByTime:
		return s.offsetQuery(req)
	case reqConsumerSendMsgBack:
		return s.sendBack(req)
	case reqUnregisterClient:
		return s.unregister(c, req)
	default:
		return fail(codeNotSupported, "request code "+strconv.Itoa(int(req.Code))+" is not supported by txmq")
	}
}

func ok(ext map[string]string, body []byte) *command {
	return &command{Code: codeSuccess, Version: version, ExtFields: ext, Body: body}
}

func fail(code int16, remark string) *command {
	return &command{Code: code, Version: version, Remark: remark}
}

// heartbeatData is the body of HEART_BEAT.
type heartbeatData struct {
	ClientID  string `json:"clientID"`
	Producers []struct {
		GroupName string `json:"groupName"`
	} `json:"producerDataSet"`
	Consumers []struct {
		GroupName string `json:"groupName"`
		Where     string `json:"consumeFromWhere"`
		Model     string `json:"messageModel"`
		Subs      []struct {
			Topic string `json:"topic"`
		} `json:"subscriptionDataSet"`
	} `json:"consumerDataSet"`
}

// innerProducer is the group every RocketMQ client registers for itself.
const innerProducer = "CLIENT_INNER_PRODUCER"

func (s *Server) heartbeat(c *conn, req *command) *command {
	var hb heartbeatData
	if err := json.Unmarshal(req.Body, &hb); err != nil {
		return fail(codeSystemError, "heartbeat body: "+err.Error())
	}
	for _, p := range hb.Producers {
		if p.GroupName != innerProducer && !c.hasProducer(p.GroupName) {
			c.registerProducer(p.GroupName)
		}
	}
	for _, cd := range hb.Consumers {
		s.addConsumer(cd.GroupName, hb.ClientID, c)
		if cd.Where == "CONSUME_FROM_TIMESTAMP" {
			// No group yet, so that the client finds no offset and
			// searches by its timestamp.
			continue
		}
		for _, sub := range cd.Subs {
			if name, ok := storeTopic(sub.Topic); ok {
				s.ensureGroup(name, cd.GroupName, cd.Where)
			}
		}
	}
	return ok(nil, nil)
}

func (s *Server) unregister(c *conn, req *command) *command {
	if id := req.field("clientID"); id != "" {
		s.removeClient(id)
	}
	if g := req.field("producerGroup"); g != "" {
		c.mu.Lock()
		id, had := c.producers[g]
		delete(c.producers, g)
		c.mu.Unlock()
		if had {
			s.cfg.Broker.UnregisterSession(g, id, c)
		}
	}
	return ok(nil, nil)
}

func (s *Server) consumerList(req *command) *command {
	body, _ := json.Marshal(map[string][]string{"consumerIdList": s.consumerIDs(req.field("consumerGroup"))})
	return ok(nil, body)
}

// route answers GET_ROUTEINFO_BY_TOPIC: the leader as the one broker, with
// Queues read and write queues. The JSON is what the Java name server
// writes, with the broker ID as a quoted key (the Go client accepts both).
func (s *Server) route(req *command) *command {
	topic := req.field("topic")
	if topic == "" {
		return fail(codeTopicNotExist, "no topic in the route query")
	}
	addr := s.leaderAddr()
	if addr == "" {
		return fail(codeServiceUnavailable, "this txmq node is not the leader and knows no RocketMQ address of a leader (none elected, or it serves no RocketMQ)")
	}
	type queueData struct {
		BrokerName     string `json:"brokerName"`
		ReadQueueNums  int    `json:"readQueueNums"`
		WriteQueueNums int    `json:"writeQueueNums"`
		Perm           int    `json:"perm"`
		TopicSynFlag   int    `json:"topicSynFlag"`
	}
	type brokerData struct {
		Cluster     string            `json:"cluster"`
		BrokerName  string            `json:"brokerName"`
		BrokerAddrs map[string]string `json:"brokerAddrs"`
	}
	body, _ := json.Marshal(struct {
		OrderTopicConf string       `json:"orderTopicConf,omitempty"`
		QueueDatas     []queueData  `json:"queueDatas"`
		BrokerDatas    []brokerData `json:"brokerDatas"`
	}{
		QueueDatas:  []queueData{{BrokerName: brokerName, ReadQueueNums: s.cfg.Queues, WriteQueueNums: s.cfg.Queues, Perm: 6}},
		BrokerDatas: []brokerData{{Cluster: clusterName, BrokerName: brokerName, BrokerAddrs: map[string]string{"0": addr}}},
	})
	return ok(nil, body)
}
