package txmq

import (
	"errors"
	"io"
	"log/slog"
	"net/http"

	"github.com/txmq/txmq/api/checkhttp"
)

// CheckHandler is the HTTP form of the check-back server, for producers that
// answer check-backs from their own web server: mount it at the URL given as
// ProducerConfig.CallbackURL (the broker POSTs to the URL exactly as
// registered). c follows the rule in Checker's doc.
//
// The protocol, which the broker speaks (package
// github.com/txmq/txmq/api/checkhttp defines it for both sides):
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
			writeAnswer(w, http.StatusMethodNotAllowed, checkhttp.EncodeError("check-backs are POSTed, not "+r.Method))
			return
		}
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, checkhttp.MaxRequestSize))
		if err != nil {
			code := http.StatusBadRequest
			if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
				code = http.StatusRequestEntityTooLarge
			}
			writeAnswer(w, code, checkhttp.EncodeError("bad check-back request: "+err.Error()))
			return
		}
		req, err := checkhttp.DecodeRequest(raw)
		if err != nil {
			writeAnswer(w, http.StatusBadRequest, checkhttp.EncodeError(err.Error()))
			return
		}
		res, err := runChecker(r.Context(), c, halfMessage(req), slog.Default().With("component", "txmq-check-handler"))
		var body []byte
		if err == nil {
			body, err = checkhttp.EncodeAnswer(res.proto())
		}
		if err != nil {
			writeAnswer(w, http.StatusInternalServerError, checkhttp.EncodeError(err.Error()))
			return
		}
		writeAnswer(w, http.StatusOK, body)
	})
}

func writeAnswer(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", checkhttp.ContentType)
	w.WriteHeader(code)
	_, _ = w.Write(body)
}
