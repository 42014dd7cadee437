package halfstore

import (
	"bytes"
	"crypto/sha256"
	"fmt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Content hashes: a transaction ID (per producer group) and a Send key
// (per topic, within the dedup window) each name one message. A repeat
// with the same topic and body is a retry and returns the first message; a
// repeat with another topic or body is refused with ErrConflict naming the
// first message. Properties, key and ordering key are not compared: they
// carry per-attempt data (trace context) that a retry may rebuild. The
// hash is kept on the record because the body is not: a resolved half
// message drops it, and a dedup record never had it.

// contentHash is the SHA-256 of a message body.
func contentHash(body []byte) []byte {
	sum := sha256.Sum256(body)
	return sum[:]
}

// sameHalf refuses a SendHalf that repeats first's transaction ID for
// another message. A record without a hash (written before schema
// version 2 and no longer holding its body) is compared by topic only.
func sameHalf(first, again *storepb.Half) error {
	what := ""
	switch {
	case first.Topic != again.Topic:
		what = fmt.Sprintf("topic %s, not %s", first.Topic, again.Topic)
	case len(first.ContentHash) > 0 && !bytes.Equal(first.ContentHash, contentHash(again.Body)):
		what = "another body"
	default:
		return nil
	}
	return fmt.Errorf("%w: transaction ID %q of producer group %s is message %s, sent with %s; a transaction ID names one message: repeat it only to retry that message, and send a new message under a new transaction ID",
		ErrConflict, first.TransactionId, first.ProducerGroup, first.Id, what)
}

// sameSend refuses a Send that repeats a key of topic, within the dedup
// window, with another body.
func sameSend(topic, key string, first *storepb.Dedup, body []byte) error {
	if len(first.ContentHash) == 0 || bytes.Equal(first.ContentHash, contentHash(body)) {
		return nil
	}
	return fmt.Errorf("%w: key %q was sent on topic %s as message %s (sequence %d) with another body, within the dedup window; a key names one message: repeat it only to retry that message, and send a new message under a new key",
		ErrConflict, key, topic, first.MessageId, first.Sequence)
}
