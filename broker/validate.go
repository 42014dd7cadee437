package broker

import (
	"strings"
	"unicode/utf8"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/api/names"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// reservedPrefix is kept for the broker's own topics.
const reservedPrefix = "txmq."

const (
	maxKeyLen        = 1024
	maxTxIDLen       = 1024
	maxProperties    = 128
	maxPropertyBytes = 64 << 10
)

func checkName(kind, name string) error {
	if name == "" {
		return invalidf("%s is required", kind)
	}
	if !names.Valid(name) {
		return invalidf("%s %q is not a valid name: use %s", kind, name, names.Rule)
	}
	return nil
}

func checkTopic(name string) error {
	if err := checkName("topic", name); err != nil {
		return err
	}
	if strings.HasPrefix(name, reservedPrefix) {
		return invalidf("topic %q: the prefix %q is reserved for the broker", name, reservedPrefix)
	}
	return nil
}

func (b *Broker) checkMessage(key, orderingKey string, props map[string]string, body []byte) error {
	if len(body) == 0 {
		return invalidf("message body is empty")
	}
	if len(body) > b.cfg.MaxMessageSize {
		return invalidf("message body is %d bytes, over the limit of %d", len(body), b.cfg.MaxMessageSize)
	}
	if len(key) > maxKeyLen {
		return invalidf("key is %d bytes, over the limit of %d", len(key), maxKeyLen)
	}
	if len(orderingKey) > maxKeyLen {
		return invalidf("ordering_key is %d bytes, over the limit of %d", len(orderingKey), maxKeyLen)
	}
	if len(props) > maxProperties {
		return invalidf("%d properties, over the limit of %d", len(props), maxProperties)
	}
	size := 0
	for k, v := range props {
		if k == "" {
			return invalidf("property with an empty name")
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return invalidf("property %q is not valid UTF-8", k)
		}
		size += len(k) + len(v)
	}
	if size > maxPropertyBytes {
		return invalidf("properties take %d bytes, over the limit of %d", size, maxPropertyBytes)
	}
	return nil
}

func checkTxID(tx string) error {
	if tx == "" {
		return invalidf("transaction_id is required: it is the idempotency key of the half message")
	}
	if len(tx) > maxTxIDLen {
		return invalidf("transaction_id is %d bytes, over the limit of %d", len(tx), maxTxIDLen)
	}
	return nil
}

// checkMessageID refuses what cannot be a message ID this broker gave out
// (32 hex characters, ids.go), so that a typo is not reported as unknown.
func checkMessageID(id string) error {
	if id == "" {
		return invalidf("message_id is required")
	}
	if _, ok := idTime(id); !ok {
		return invalidf("message_id %q is not a txmq message ID (32 hex characters)", id)
	}
	return nil
}

func checkTransactionRef(tr *txmqv1.TransactionRef) error {
	if err := checkName("producer_group", tr.GetProducerGroup()); err != nil {
		return err
	}
	return checkTxID(tr.GetTransactionId())
}

// halfRef names a half message: by message ID, or by producer group and
// transaction ID.
type halfRef struct{ id, group, txID string }

// checkHalfRef checks a request that names a half message by message_id
// or by transaction: exactly one of them.
func checkHalfRef(id string, tr *txmqv1.TransactionRef) (halfRef, error) {
	switch {
	case id != "" && tr != nil:
		return halfRef{}, invalidf("name the half message by message_id or by transaction, not both")
	case tr != nil:
		if err := checkTransactionRef(tr); err != nil {
			return halfRef{}, err
		}
		return halfRef{group: tr.ProducerGroup, txID: tr.TransactionId}, nil
	case id == "":
		return halfRef{}, invalidf("name the half message by message_id or by transaction (producer_group + transaction_id)")
	}
	return halfRef{id: id}, checkMessageID(id)
}

// half reads the message r names.
func (r halfRef) half(tx *halfstore.Tx) (*storepb.Half, error) {
	id := r.id
	if id == "" {
		var err error
		if id, err = tx.HalfIDByTx(r.group, r.txID); err != nil {
			return nil, err
		}
	}
	return tx.Half(id)
}

// resolve is the command that resolves the message r names.
func (r halfRef) resolve(source storepb.Source) *raftpb.Resolve {
	return &raftpb.Resolve{MessageId: r.id, ProducerGroup: r.group, TransactionId: r.txID, Source: source}
}
