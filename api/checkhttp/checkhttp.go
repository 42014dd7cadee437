// Package checkhttp is the HTTP form of a check-back, defined once: the JSON
// the broker POSTs to a producer group's callback URL (checkback's caller)
// and the JSON the producer answers with (the Go client's CheckHandler, or
// any plain web server). A check-back is the API's CheckTransactionRequest,
// over HTTP as over gRPC. It depends only on the generated API and the
// standard library, so that both sides can import it.
//
// The request, POSTed with Content-Type: application/json:
//
//	{
//	  "message_id": "…",
//	  "topic": "…",
//	  "producer_group": "…",
//	  "transaction_id": "…",
//	  "key": "…",
//	  "properties": {"k": "v"},
//	  "body_base64": "…",
//	  "attempt": 1,
//	  "created_at": "2026-05-01T10:00:00.123456789Z"
//	}
//
// body_base64 is the body in standard base64 (RFC 4648, with padding);
// created_at is RFC 3339 with optional fractional seconds (Go's
// time.RFC3339Nano); attempt is 1 on the first check-back of the message.
// Unknown fields are ignored.
//
// The answer: status 200 with {"resolution":"commit"}, {"resolution":"rollback"}
// or {"resolution":"unknown"} (read case-insensitively); any other status is
// an error, with the producer's text in {"error":"…"} when it sends one.
package checkhttp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

const (
	// ContentType is the media type of requests and answers.
	ContentType = "application/json"
	// MaxRequestSize bounds a check-back request, in JSON or over gRPC: a
	// check-back of the broker's largest message (4 MiB of body, a third
	// more in base64) with its envelope fits well within it.
	MaxRequestSize = 16 << 20
	// MaxAnswerSize bounds how much of an answer the broker reads.
	MaxAnswerSize = 64 << 10
)

var (
	// ErrBadRequest: a request body that is not one such JSON object, has a
	// body_base64 that is not base64, or no transaction_id.
	ErrBadRequest = errors.New("checkhttp: bad check-back request")
	// ErrBadAnswer: a 200 answer that is not JSON or names no known
	// resolution.
	ErrBadAnswer = errors.New("checkhttp: bad check-back answer")
)

// requestJSON is the wire form of a check-back: the gRPC
// CheckTransactionRequest, field for field. time.Time encodes as
// RFC3339Nano and decodes RFC 3339 strictly.
type requestJSON struct {
	MessageID     string            `json:"message_id"`
	Topic         string            `json:"topic"`
	ProducerGroup string            `json:"producer_group"`
	TransactionID string            `json:"transaction_id"`
	Key           string            `json:"key"`
	Properties    map[string]string `json:"properties"`
	BodyBase64    string            `json:"body_base64"`
	Attempt       uint32            `json:"attempt"`
	CreatedAt     time.Time         `json:"created_at"`
}

// answerJSON is the wire form of an answer: a 200 carries a resolution,
// any other status an error.
type answerJSON struct {
	Resolution string `json:"resolution"`
	Error      string `json:"error"`
}

type resolutionJSON struct {
	Resolution string `json:"resolution"`
}

type errorJSON struct {
	Error string `json:"error"`
}

// EncodeRequest is the body the broker POSTs for the check-back r.
func EncodeRequest(r *txmqv1.CheckTransactionRequest) ([]byte, error) {
	w := requestJSON{
		MessageID:     r.GetMessageId(),
		Topic:         r.GetTopic(),
		ProducerGroup: r.GetProducerGroup(),
		TransactionID: r.GetTransactionId(),
		Key:           r.GetKey(),
		Properties:    r.GetProperties(),
		BodyBase64:    base64.StdEncoding.EncodeToString(r.GetBody()),
		Attempt:       r.GetAttempt(),
	}
	if ts := r.GetCreatedAt(); ts != nil {
		w.CreatedAt = ts.AsTime()
	}
	b, err := json.Marshal(w)
	if err != nil {
		return nil, fmt.Errorf("checkhttp: encode request for %s: %w", r.GetMessageId(), err)
	}
	return b, nil
}

// DecodeRequest reads a request body: one JSON object and nothing after it
// but white space. It does not bound the size; the server reading the body
// does (MaxRequestSize).
func DecodeRequest(body []byte) (*txmqv1.CheckTransactionRequest, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	var w requestJSON
	if err := dec.Decode(&w); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrBadRequest)
	}
	if w.TransactionID == "" {
		return nil, fmt.Errorf("%w: transaction_id is empty", ErrBadRequest)
	}
	raw, err := base64.StdEncoding.DecodeString(w.BodyBase64)
	if err != nil {
		return nil, fmt.Errorf("%w: body_base64: %w", ErrBadRequest, err)
	}
	r := &txmqv1.CheckTransactionRequest{
		MessageId:     w.MessageID,
		Topic:         w.Topic,
		ProducerGroup: w.ProducerGroup,
		TransactionId: w.TransactionID,
		Key:           w.Key,
		Properties:    w.Properties,
		Body:          raw,
		Attempt:       w.Attempt,
	}
	if !w.CreatedAt.IsZero() {
		r.CreatedAt = timestamppb.New(w.CreatedAt)
	}
	return r, nil
}

// resolutionNames are the answers' resolutions on the wire.
var resolutionNames = map[txmqv1.Resolution]string{
	txmqv1.Resolution_RESOLUTION_COMMIT:   "commit",
	txmqv1.Resolution_RESOLUTION_ROLLBACK: "rollback",
	txmqv1.Resolution_RESOLUTION_UNKNOWN:  "unknown",
}

// EncodeAnswer is the body of a 200 answer with res: COMMIT, ROLLBACK or
// UNKNOWN.
func EncodeAnswer(res txmqv1.Resolution) ([]byte, error) {
	name, ok := resolutionNames[res]
	if !ok {
		return nil, fmt.Errorf("checkhttp: %v is not a resolution a producer can answer", res)
	}
	return encodeAnswer(resolutionJSON{Resolution: name}), nil
}

// EncodeError is the body of an answer other than 200, carrying msg.
func EncodeError(msg string) []byte {
	return encodeAnswer(errorJSON{Error: msg})
}

func encodeAnswer(a any) []byte {
	// A struct of one string always marshals.
	b, _ := json.Marshal(a)
	return append(b, '\n')
}

// DecodeAnswer reads the producer's answer from its HTTP status code and
// body: the resolution of a 200, or an error. An error answer is
// "HTTP <code> <the producer's error text>"; a 200 that does not hold a known
// resolution is ErrBadAnswer.
func DecodeAnswer(code int, body []byte) (txmqv1.Resolution, error) {
	var a answerJSON
	if code != http.StatusOK {
		// The text is a courtesy of the producer; a body that is not JSON
		// leaves it out.
		_ = json.Unmarshal(body, &a)
		return 0, fmt.Errorf("HTTP %d %s", code, a.Error)
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return 0, fmt.Errorf("%w: not JSON: %w", ErrBadAnswer, err)
	}
	for res, name := range resolutionNames {
		if strings.EqualFold(a.Resolution, name) {
			return res, nil
		}
	}
	return 0, fmt.Errorf(`%w: resolution %q is not "commit", "rollback" or "unknown"`, ErrBadAnswer, a.Resolution)
}
