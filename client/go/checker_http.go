package txmq

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"
)

// checkRequestJSON is the body of an HTTP check-back.
type checkRequestJSON struct {
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

type checkResponseJSON struct {
	Resolution string `json:"resolution"`
}

type checkErrorJSON struct {
	Error string `json:"error"`
}

// CheckHandler is the HTTP form of the check-back server, for producers that
// answer check-backs from their own web server: mount it at the URL given as
// ProducerConfig.CallbackURL (the broker POSTs to the URL exactly as
// registered). c follows the rule in Checker's doc.
//
// The protocol, which the broker speaks:
//
// Request: POST, Content-Type: application/json, body
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
// body_base64 is the message body in standard base64 (RFC 4648, with
// padding); created_at is RFC 3339 with optional fractional seconds
// (Go's time.RFC3339Nano); attempt is 1 on the first check-back of the
// message. Unknown fields are ignored.
//
// Responses, all with Content-Type: application/json:
//   - 200 {"resolution":"commit"}, {"resolution":"rollback"} or
//     {"resolution":"unknown"}: the Checker's answer;
//   - 500 {"error":"…"}: the Checker returned an error or panicked; the
//     broker counts it like "unknown" and asks again later;
//   - 405 {"error":"…"} with Allow: POST, for any other method;
//   - 400 {"error":"…"}: the body is not such a JSON object, body_base64 is
//     not base64, or transaction_id is empty;
//   - 413 {"error":"…"}: the body is over 16 MiB.
//
// Unlike the gRPC server NewProducer starts, the handler does not check
// producer_group, which c can do. The handler adds no authentication: wrap
// it, or serve it where only the brokers can reach it. CheckHandler panics
// if c is nil.
func CheckHandler(c Checker) http.Handler {
	if c == nil {
		panic("txmq: CheckHandler with a nil Checker")
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeJSON(w, http.StatusMethodNotAllowed, checkErrorJSON{Error: "check-backs are POSTed, not " + r.Method})
			return
		}
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxCheckRequest))
		var req checkRequestJSON
		err := dec.Decode(&req)
		if err == nil {
			// One JSON object and nothing after it.
			if _, extra := dec.Token(); extra != io.EOF {
				err = errors.New("data after the JSON object")
			}
		}
		if err != nil {
			code := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				code = http.StatusRequestEntityTooLarge
			}
			writeJSON(w, code, checkErrorJSON{Error: "bad check-back request: " + err.Error()})
			return
		}
		body, err := base64.StdEncoding.DecodeString(req.BodyBase64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, checkErrorJSON{Error: "bad check-back request: body_base64: " + err.Error()})
			return
		}
		if req.TransactionID == "" {
			writeJSON(w, http.StatusBadRequest, checkErrorJSON{Error: "bad check-back request: transaction_id is empty"})
			return
		}
		m := HalfMessage{
			MessageID:     req.MessageID,
			Topic:         req.Topic,
			ProducerGroup: req.ProducerGroup,
			TransactionID: req.TransactionID,
			Key:           req.Key,
			Properties:    req.Properties,
			Body:          body,
			Attempt:       req.Attempt,
			CreatedAt:     req.CreatedAt,
		}
		res, err := runChecker(r.Context(), c, m, slog.Default().With("component", "txmq-check-handler"))
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, checkErrorJSON{Error: err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, checkResponseJSON{Resolution: res.String()})
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only plain structs of strings are written here.
		panic(fmt.Sprintf("txmq: encode %T: %v", v, err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}
