package broker

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

func sessionSendTo(id uint64, topic string) *txmqv1.SessionRequest {
	return &txmqv1.SessionRequest{Id: id, Kind: &txmqv1.SessionRequest_Send{Send: &txmqv1.SendRequest{Topic: topic, Body: []byte("x")}}}
}

// TestAuthSessionRefusesPerRequest: a request of a producer session that
// the rules refuse is answered with PermissionDenied under its ID, changes
// nothing, and the session goes on; so does one over the rate limit.
func TestAuthSessionRefusesPerRequest(t *testing.T) {
	tb, _ := startAuthBroker(t)
	s := openProducerSessionWith(t, as(t, "order"), tb)
	require.NotNil(t, s.do(sessionSendTo(1, "orders")).GetSend())

	before := txmqtest.StoreContent(t, tb.Node())
	e := s.do(sessionSendTo(2, "bills")).GetError()
	require.NotNil(t, e)
	require.Equal(t, codes.PermissionDenied, codes.Code(e.Code))
	require.Contains(t, e.Message, `principal "order" may not publish on topic:bills`)
	e = s.do(&txmqv1.SessionRequest{Id: 3, Kind: &txmqv1.SessionRequest_EndTransaction{EndTransaction: &txmqv1.EndTransactionRequest{
		Target:     &txmqv1.EndTransactionRequest_Transaction{Transaction: &txmqv1.TransactionRef{ProducerGroup: "billing", TransactionId: "b-1"}},
		Resolution: txmqv1.Resolution_RESOLUTION_COMMIT,
	}}}).GetError()
	require.NotNil(t, e)
	require.Equal(t, codes.PermissionDenied, codes.Code(e.Code))
	require.Equal(t, before, txmqtest.StoreContent(t, tb.Node()), "refused requests changed the store")
	require.NotNil(t, s.do(sessionSendTo(4, "orders")).GetSend())

	// limited may make 2 requests a second: the third of a quick run is
	// refused with when to retry, and the session still answers.
	l := openProducerSessionWith(t, as(t, "limited"), tb)
	var refused *txmqv1.SessionError
	for id := uint64(1); id <= 5 && refused == nil; id++ {
		refused = l.do(sessionSendTo(id, "orders")).GetError()
	}
	require.NotNil(t, refused)
	require.Equal(t, codes.ResourceExhausted, codes.Code(refused.Code))
	require.Contains(t, refused.Message, `principal "limited" is over its limit of 2 requests/s; retry in`)
	txmqtest.CheckFor(t, 10*time.Second, 50*time.Millisecond, func() error {
		if e := l.do(sessionSendTo(100, "orders")).GetError(); e != nil {
			return errors.New(e.Message)
		}
		return nil
	})
}

// TestAuthSubscribeAcksWait: a consumer over its rate limit is slowed
// down, not cut off: each of its acks waits for the bucket, and every
// one is confirmed on the same stream.
func TestAuthSubscribeAcksWait(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.yaml")
	writeAuthFileLimits(t, path, testPrincipals, map[string]string{"points": "requests_per_second: 4"}, testRules)
	tb := startBroker(t, func(c *Config) { c.AuthFile = path })
	sub := subscribeWith(t, as(t, "points"), tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "points"})
	const n = 10
	for range n {
		_, err := tb.producer.Send(as(t, "order"), &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")})
		require.NoError(t, err)
	}
	var ids []string
	for range n {
		d := sub.next(10 * time.Second)
		require.NotNil(t, d)
		ids = append(ids, d.MessageId)
		sub.ack(d.MessageId)
	}
	// 10 acks at 4 a second: the last waits about 2 s.
	sub.waitConfirm(ids...)
}

// TestAuthReloadLimitsOfOpenStreams: a reload gives a principal with a
// stream open its new limits.
func TestAuthReloadLimitsOfOpenStreams(t *testing.T) {
	tb, path := startAuthBroker(t)
	s := openProducerSessionWith(t, as(t, "limited"), tb)
	var refused *txmqv1.SessionError
	for id := uint64(1); id <= 5 && refused == nil; id++ {
		refused = s.do(sessionSendTo(id, "orders")).GetError()
	}
	require.NotNil(t, refused)
	writeAuthFileLimits(t, path, testPrincipals, map[string]string{"limited": "requests_per_second: 1000"}, testRules)
	require.NoError(t, tb.ReloadAuth())
	// The bucket refills at the new rate: soon every request passes.
	txmqtest.CheckFor(t, 5*time.Second, 20*time.Millisecond, func() error {
		for id := uint64(10); id < 30; id++ {
			if e := s.do(sessionSendTo(id, "orders")).GetError(); e != nil {
				return errors.New(e.Message)
			}
		}
		return nil
	})
}

// TestAuthWrongTokenRightAfterReload: a wrong token is remembered as
// wrong (it is not compared with every hash again), until a reload
// whose file makes it right.
func TestAuthWrongTokenRightAfterReload(t *testing.T) {
	tb, path := startAuthBroker(t)
	send := func() error {
		_, err := tb.producer.Send(as(t, "newcomer"), &txmqv1.SendRequest{Topic: "orders", Body: []byte("x")})
		return err
	}
	for range 2 {
		err := send()
		require.Equal(t, codes.Unauthenticated, codeOf(err), "%v", err)
	}
	tb.auth.mu.Lock()
	require.Contains(t, tb.auth.wrong, tokenKey("newcomer-secret"))
	tb.auth.mu.Unlock()
	writeAuthFile(t, path, append(testPrincipals, "newcomer"), testRules+`
  - who: [newcomer]
    resources: [topic:orders]
    actions: [publish]
    decision: allow
`)
	require.NoError(t, tb.ReloadAuth())
	require.NoError(t, send())
}
