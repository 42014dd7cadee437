package checkhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// docRequest is the example of docs/api.md, as a producer receives it.
const docRequest = `{
  "message_id": "000001a22ac7be7a48d582fa1bd1af94",
  "topic": "orders",
  "producer_group": "shop",
  "transaction_id": "order-42:paid",
  "key": "",
  "properties": {"source": "web"},
  "body_base64": "b3JkZXItNDIgcGFpZA==",
  "attempt": 1,
  "created_at": "2026-11-30T04:47:43.123456789Z"
}`

func at(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }

func TestDecodeDocumentedRequest(t *testing.T) {
	got, err := DecodeRequest([]byte(docRequest))
	if err != nil {
		t.Fatal(err)
	}
	want := &txmqv1.CheckTransactionRequest{
		MessageId: "000001a22ac7be7a48d582fa1bd1af94", Topic: "orders", ProducerGroup: "shop",
		TransactionId: "order-42:paid", Properties: map[string]string{"source": "web"},
		Body: []byte("order-42 paid"), Attempt: 1,
		CreatedAt: at(time.Date(2026, 11, 30, 4, 47, 43, 123456789, time.UTC)),
	}
	if !proto.Equal(got, want) {
		t.Errorf("decoded %+v\nwant    %+v", got, want)
	}
}

// The wire form is what docs/api.md says, field for field: plain web servers
// parse it with their own code.
func TestEncodeRequestWireForm(t *testing.T) {
	b, err := EncodeRequest(&txmqv1.CheckTransactionRequest{
		MessageId: "m1", Topic: "orders", ProducerGroup: "shop", TransactionId: "order-42:paid",
		Key: "k", Properties: map[string]string{"p": "v"}, Body: []byte{0, 1, 0xff, 0xfe}, Attempt: 2,
		CreatedAt: at(time.Date(2026, 5, 1, 10, 0, 0, 120000000, time.UTC)),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"message_id":"m1","topic":"orders","producer_group":"shop","transaction_id":"order-42:paid",` +
		`"key":"k","properties":{"p":"v"},"body_base64":"AAH//g==","attempt":2,"created_at":"2026-05-01T10:00:00.12Z"}`
	if string(b) != want {
		t.Errorf("encoded\n%s\nwant\n%s", b, want)
	}
}

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []*txmqv1.CheckTransactionRequest{
		{TransactionId: "t"},
		{
			MessageId: "m", Topic: "orders", ProducerGroup: "shop", TransactionId: "order-42:paid", Key: "k",
			Properties: map[string]string{"a": "1", "ü": "\x00"}, Body: bytes.Repeat([]byte{0, 0xff}, 1000),
			Attempt: 15, CreatedAt: at(time.Date(2026, 5, 1, 10, 0, 0, 1, time.UTC)),
		},
		{TransactionId: "zone", CreatedAt: at(time.Date(2026, 5, 1, 10, 0, 0, 0, time.FixedZone("", 3600)))},
	} {
		b, err := EncodeRequest(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRequest(b)
		if err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		if !proto.Equal(got, r) {
			t.Errorf("round trip of %v gave %v", r, got)
		}
	}
	if _, err := EncodeRequest(&txmqv1.CheckTransactionRequest{TransactionId: "t", CreatedAt: at(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))}); err == nil {
		t.Error("a created_at past year 9999 has no RFC 3339 form, yet it encoded")
	}
}

func TestDecodeRequestRefuses(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":       `resolution please`,
		"empty":          ``,
		"truncated":      `{"transaction_id":"commit"`,
		"two objects":    `{"transaction_id":"commit"} {}`,
		"a trailing ]":   `{"transaction_id":"commit"}]`,
		"wrong type":     `{"transaction_id":"commit","attempt":"one"}`,
		"bad base64":     `{"transaction_id":"commit","body_base64":"not base64!"}`,
		"bad created_at": `{"transaction_id":"commit","created_at":"yesterday"}`,
		"no tx ID":       `{"message_id":"01HX"}`,
		"null":           `null`,
	} {
		_, err := DecodeRequest([]byte(body))
		if !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: got %v, want ErrBadRequest", name, err)
		}
	}
	if _, err := DecodeRequest([]byte(" {\"transaction_id\":\"t\",\"unknown\":[1]}\n\t")); err != nil {
		t.Errorf("white space and unknown fields: %v", err)
	}
}

func TestAnswers(t *testing.T) {
	for res, body := range map[txmqv1.Resolution]string{
		txmqv1.Resolution_RESOLUTION_COMMIT:   `{"resolution":"commit"}`,
		txmqv1.Resolution_RESOLUTION_ROLLBACK: `{"resolution":"rollback"}`,
		txmqv1.Resolution_RESOLUTION_UNKNOWN:  `{"resolution":"unknown"}`,
	} {
		b, err := EncodeAnswer(res)
		if err != nil || string(b) != body+"\n" {
			t.Errorf("EncodeAnswer(%v) = %q, %v; want %q", res, b, err, body)
		}
		got, err := DecodeAnswer(http.StatusOK, b)
		if err != nil || got != res {
			t.Errorf("DecodeAnswer(%s) = %v, %v", b, got, err)
		}
		// Producers may shout.
		got, err = DecodeAnswer(http.StatusOK, []byte(strings.ToUpper(body)))
		if err != nil || got != res {
			t.Errorf("DecodeAnswer of %s in capitals = %v, %v", body, got, err)
		}
	}
	if _, err := EncodeAnswer(txmqv1.Resolution_RESOLUTION_UNSPECIFIED); err == nil {
		t.Error("UNSPECIFIED encoded as an answer")
	}
	if b := EncodeError("db down"); string(b) != `{"error":"db down"}`+"\n" {
		t.Errorf("EncodeError = %q", b)
	}

	for _, tc := range []struct {
		code    int
		body    string
		want    string
		badAns  bool
		comment string
	}{
		{500, `{"error":"db down"}`, "HTTP 500 db down", false, "the producer's text"},
		{502, `<html>bad gateway</html>`, "HTTP 502 ", false, "a body that is not JSON"},
		{200, `{"resolution":"maybe"}`, `resolution "maybe" is not`, true, "an unknown resolution"},
		{200, `{}`, `resolution "" is not`, true, "no resolution"},
		{200, `ok`, "not JSON", true, "not JSON"},
	} {
		_, err := DecodeAnswer(tc.code, []byte(tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrBadAnswer) != tc.badAns {
			t.Errorf("%s: got %v, want an error with %q (ErrBadAnswer: %v)", tc.comment, err, tc.want, tc.badAns)
		}
	}
}

// FuzzDecodeRequest: any body either is refused with ErrBadRequest or
// decodes to a request that encodes and decodes back to itself.
func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(docRequest))
	f.Add([]byte(`{"transaction_id":"t","properties":{},"body_base64":""}`))
	f.Add([]byte(`{"transaction_id":"t","created_at":"2026-05-01T10:00:00+01:00"}`))
	f.Add([]byte(`{"transaction_id":"t"} x`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		r, err := DecodeRequest(body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %v is not ErrBadRequest", err)
			}
			return
		}
		b, err := EncodeRequest(r)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		again, err := DecodeRequest(b)
		if err != nil {
			t.Fatalf("re-encoded %s does not decode: %v", b, err)
		}
		if !proto.Equal(r, again) {
			t.Fatalf("round trip changed %+v into %+v", r, again)
		}
	})
}

// FuzzDecodeAnswer: any answer gives a resolution a producer can send, or
// an error.
func FuzzDecodeAnswer(f *testing.F) {
	f.Add(200, []byte(`{"resolution":"Commit"}`))
	f.Add(500, []byte(`{"error":"db down"}`))
	f.Add(200, []byte(`{"resolution":1}`))
	f.Fuzz(func(t *testing.T, code int, body []byte) {
		res, err := DecodeAnswer(code, body)
		if err != nil {
			return
		}
		if code != http.StatusOK {
			t.Fatalf("status %d gave %v without an error", code, res)
		}
		if _, err := EncodeAnswer(res); err != nil {
			t.Fatalf("decoded %v, which no producer can answer", res)
		}
		if !json.Valid(body) {
			t.Fatalf("%q is not JSON, yet decoded to %v", body, res)
		}
	})
}
