package broker

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// The operators' lookups refuse bad input with InvalidArgument or NotFound
// and a message that says what is wrong.
func TestAdminLookupsRefuseBadInput(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	id := sendHalf(t, tb, "orders", "shop", "t1", "x")
	tx := &txmqv1.TransactionRef{ProducerGroup: "shop", TransactionId: "t1"}
	for _, tc := range []struct {
		name string
		call func() error
		code codes.Code
		msg  string
	}{
		{"half by ID and transaction", func() error {
			_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: id, Transaction: tx})
			return err
		}, codes.InvalidArgument, "not both"},
		{"half by nothing", func() error {
			_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{})
			return err
		}, codes.InvalidArgument, "producer_group + transaction_id"},
		{"half by a transaction without ID", func() error {
			_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{Transaction: &txmqv1.TransactionRef{ProducerGroup: "shop"}})
			return err
		}, codes.InvalidArgument, "transaction_id is required"},
		{"half by an unknown transaction", func() error {
			_, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{Transaction: &txmqv1.TransactionRef{ProducerGroup: "shop", TransactionId: "t9"}})
			return err
		}, codes.NotFound, `"t9"`},
		{"resolve by an unknown transaction", func() error {
			_, err := tb.admin.ResolveHalfMessage(ctx, &txmqv1.ResolveHalfMessageRequest{
				Transaction: &txmqv1.TransactionRef{ProducerGroup: "shop", TransactionId: "t9"}, Resolution: txmqv1.Resolution_RESOLUTION_COMMIT})
			return err
		}, codes.NotFound, "t9"},
		{"list older than a negative age", func() error {
			_, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{OlderThan: durationpb.New(-1)})
			return err
		}, codes.InvalidArgument, "older_than"},
		{"list a bad topic", func() error {
			_, err := tb.admin.ListHalfMessages(ctx, &txmqv1.ListHalfMessagesRequest{Topic: "a/b"})
			return err
		}, codes.InvalidArgument, "topic"},
		{"message by nothing", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{})
			return err
		}, codes.InvalidArgument, "topic and sequence, or by message_id"},
		{"message by sequence 0", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{Topic: "orders"})
			return err
		}, codes.InvalidArgument, "sequences start at 1"},
		{"message by ID and sequence", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{Topic: "orders", Sequence: 1, MessageId: id})
			return err
		}, codes.InvalidArgument, "not both"},
		{"message of an unknown topic", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{Topic: "nosuch", Sequence: 1})
			return err
		}, codes.NotFound, "nosuch"},
		{"message of an empty topic", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{Topic: "orders", Sequence: 1})
			return err
		}, codes.NotFound, "it retains none"},
		{"message by an unknown ID", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{MessageId: unknownID})
			return err
		}, codes.NotFound, unknownID},
		{"message of a pending half message", func() error {
			_, err := tb.admin.GetMessage(ctx, &txmqv1.GetMessageRequest{MessageId: id})
			return err
		}, codes.NotFound, "PENDING"},
		{"find without key", func() error {
			_, err := tb.admin.FindMessages(ctx, &txmqv1.FindMessagesRequest{})
			return err
		}, codes.InvalidArgument, "key is required"},
		{"find with a made-up token", func() error {
			_, err := tb.admin.FindMessages(ctx, &txmqv1.FindMessagesRequest{Key: "k", PageToken: "orders"})
			return err
		}, codes.InvalidArgument, "page_token"},
		{"read with a sequence and a position", func() error {
			_, err := tb.admin.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "orders", FromSequence: 1,
				StartPosition: txmqv1.StartPosition_START_POSITION_LATEST})
			return err
		}, codes.InvalidArgument, "not both"},
		{"read a timestamp without time", func() error {
			_, err := tb.admin.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "orders",
				StartPosition: txmqv1.StartPosition_START_POSITION_TIMESTAMP})
			return err
		}, codes.InvalidArgument, "valid time"},
		{"read an unknown topic", func() error {
			_, err := tb.admin.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "nosuch"})
			return err
		}, codes.NotFound, "nosuch"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.Equal(t, tc.code, codeOf(err), "%v", err)
			require.Contains(t, err.Error(), tc.msg)
		})
	}
	// The half message is as it was.
	h, err := tb.admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{Transaction: tx})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.Message.State)
}

// ReadMessages stops after about 1 MiB of bodies and says where to go on;
// it creates no consumer group.
func TestReadMessagesPages(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	body := bytes.Repeat([]byte("x"), 600<<10)
	for range 3 {
		_, err := tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "big", Body: body})
		require.NoError(t, err)
	}
	r, err := tb.admin.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "big"})
	require.NoError(t, err)
	require.Len(t, r.Messages, 2)
	require.Equal(t, uint64(3), r.NextSequence)
	r, err = tb.admin.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "big", FromSequence: r.NextSequence})
	require.NoError(t, err)
	require.Len(t, r.Messages, 1)
	require.Equal(t, body, r.Messages[0].Body)
	require.Equal(t, uint64(4), r.NextSequence)
	r, err = tb.admin.ReadMessages(ctx, &txmqv1.ReadMessagesRequest{Topic: "big", StartPosition: txmqv1.StartPosition_START_POSITION_LATEST})
	require.NoError(t, err)
	require.Empty(t, r.Messages)
	require.Equal(t, uint64(4), r.NextSequence)
	topics, err := tb.admin.ListTopics(ctx, &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	require.Len(t, topics.Topics, 1)
	require.Empty(t, topics.Topics[0].ConsumerGroups)
}
