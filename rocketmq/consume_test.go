package rocketmq

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore/storepb"
)

func TestQueueMapping(t *testing.T) {
	s := &Server{cfg: Config{Queues: 4}}
	for seq := uint64(1); seq <= 40; seq++ {
		q, off := s.position(seq)
		require.Equal(t, seq, s.seqAt(q, off))
		require.Equal(t, off, s.countIn(q, seq-1), "offset = messages of the queue before it")
	}
	// Log 3..10 retained: queue 0 holds 1, 5, 9 → min 1 (5 is the oldest
	// retained), max 3.
	min, max := s.bounds(&storepb.Topic{FirstSequence: 3, LastSequence: 10}, 0)
	require.Equal(t, int64(1), min)
	require.Equal(t, int64(3), max)
	min, max = s.bounds(&storepb.Topic{FirstSequence: 1, LastSequence: 0}, 2)
	require.Zero(t, min)
	require.Zero(t, max)
}

// A pull at the end of a queue waits for the next message of the queue
// (long polling); offsets commit as acks and read back.
func TestPullLongPollAndOffsets(t *testing.T) {
	s := newServer(t)
	s.cfg.MaxPollWait = 10 * time.Second
	nc, r := dial(t, s)
	send := func(body string) {
		_, err := s.cfg.Broker.Producer().Send(context.Background(), &txmqv1.SendRequest{Topic: "poll", Body: []byte(body)})
		require.NoError(t, err)
	}
	for i := range 4 {
		send(fmt.Sprint("m", i))
	}
	pull := func(opaque int32, q, off int) *command {
		return call(t, nc, r, &command{Code: reqPullMessage, Opaque: opaque, ExtFields: map[string]string{
			"consumerGroup": "g", "topic": "poll", "queueId": strconv.Itoa(q), "queueOffset": strconv.Itoa(off),
			"maxMsgNums": "32", "sysFlag": strconv.Itoa(pullSuspend), "suspendTimeoutMillis": "10000", "subscription": "*",
		}})
	}
	resp := pull(1, 1, 0)
	require.Equal(t, int16(codeSuccess), resp.Code)
	require.Equal(t, "1", resp.ExtFields["nextBeginOffset"])
	require.Contains(t, string(resp.Body), "m1", "queue 1 holds sequence 2")

	// At the end of queue 1: the pull waits until sequence 6 arrives.
	go func() {
		// Most likely parked by then; if not, the pull finds m5 at once.
		time.Sleep(300 * time.Millisecond)
		for i := 4; i < 6; i++ {
			send(fmt.Sprint("m", i))
		}
	}()
	start := time.Now()
	resp = pull(2, 1, 1)
	require.Equal(t, int16(codeSuccess), resp.Code)
	require.Contains(t, string(resp.Body), "m5")
	require.Less(t, time.Since(start), 5*time.Second, "woken by the append, not by the poll's end")

	q := func(opaque int32) *command {
		return call(t, nc, r, &command{Code: reqQueryConsumerOffset, Opaque: opaque, ExtFields: map[string]string{
			"consumerGroup": "g", "topic": "poll", "queueId": "1"}})
	}
	require.Equal(t, int16(codeQueryNotFound), q(3).Code, "no group yet")
	resp = call(t, nc, r, &command{Code: reqUpdateConsumerOff, Opaque: 4, ExtFields: map[string]string{
		"consumerGroup": "g", "topic": "poll", "queueId": "1", "commitOffset": "2"}})
	require.Equal(t, int16(codeSuccess), resp.Code)
	resp = q(5)
	require.Equal(t, int16(codeSuccess), resp.Code)
	require.Equal(t, "2", resp.ExtFields["offset"])
	resp = call(t, nc, r, &command{Code: reqGetMaxOffset, Opaque: 6, ExtFields: map[string]string{"topic": "poll", "queueId": "1"}})
	require.Equal(t, "2", resp.ExtFields["offset"])
	resp = call(t, nc, r, &command{Code: reqGetMaxOffset, Opaque: 7, ExtFields: map[string]string{"topic": "poll", "queueId": "9"}})
	require.Equal(t, int16(codeSystemError), resp.Code, "queue 9 does not exist")
}

// A stopping consumer commits its offsets without waiting for the answer
// (here one-way) and the next instance of its group asks for them at once,
// on another connection: the query answers with the commit, not with the
// offsets before it.
func TestOnewayOffsetCommitSeenByTheNextQuery(t *testing.T) {
	s := newServer(t)
	for i := range 40 {
		_, err := s.cfg.Broker.Producer().Send(context.Background(), &txmqv1.SendRequest{Topic: "ledger", Body: []byte(fmt.Sprint("m", i))})
		require.NoError(t, err)
	}
	stopping, sr := dial(t, s)
	next, r := dial(t, s)
	for round := 1; round <= 10; round++ {
		f, err := encode(&command{Code: reqUpdateConsumerOff, Opaque: int32(round), Flag: flagOneway, ExtFields: map[string]string{
			"consumerGroup": "readers", "topic": "ledger", "queueId": "2", "commitOffset": strconv.Itoa(round)}})
		require.NoError(t, err)
		_, err = stopping.Write(f)
		require.NoError(t, err)
		// The commit is read before the query: the server reads a
		// connection's frames in order, and this one's answer comes after.
		resp := call(t, stopping, sr, &command{Code: reqGetMaxOffset, Opaque: int32(100 + round), ExtFields: map[string]string{"topic": "ledger", "queueId": "2"}})
		require.Equal(t, int16(codeSuccess), resp.Code)
		resp = call(t, next, r, &command{Code: reqQueryConsumerOffset, Opaque: int32(200 + round), ExtFields: map[string]string{
			"consumerGroup": "readers", "topic": "ledger", "queueId": "2"}})
		require.Equal(t, int16(codeSuccess), resp.Code, resp.Remark)
		require.Equal(t, strconv.Itoa(round), resp.ExtFields["offset"], "round %d", round)
	}
}
