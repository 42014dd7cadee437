package broker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/txmqtest"
)

// subscribeStart opens a Subscribe stream with start and returns the error
// it ends with before (or instead of) its Subscribed answer; nil when it
// subscribed, and the stream stays open until the test ends.
func subscribeStart(t *testing.T, tb *testBroker, start *txmqv1.SubscriptionStart) error {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxT(t))
	t.Cleanup(cancel)
	stream, err := tb.consumer.Subscribe(ctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: start}}))
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	require.NotNil(t, first.GetSubscribed())
	return nil
}

func TestDeleteTopic(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	sendN(t, tb, "orders", 3, nil)
	sub := subscribe(t, tb, "orders", "g", 10)
	require.NotNil(t, sub.next(5*time.Second))
	id := sendHalf(t, tb, "orders", "shop", "tx-1", "pending")

	dry, err := tb.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "orders", DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Equal(t, uint64(3), dry.Topic.Messages)
	require.Positive(t, dry.Topic.Bytes)
	require.Len(t, dry.ConsumerGroups, 1)
	require.Equal(t, "g", dry.ConsumerGroups[0].ConsumerGroup)
	require.Equal(t, uint64(3), dry.ConsumerGroups[0].Lag)
	require.Equal(t, uint32(1), dry.ConsumerGroups[0].Subscribers)
	require.True(t, dry.ConsumerGroups[0].AutoCreated)
	require.Equal(t, uint64(1), dry.PendingHalfMessages)

	_, err = tb.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "orders"})
	require.Equal(t, codes.FailedPrecondition, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), "1 half message(s) PENDING or EXPIRED")
	_, err = tb.admin.ResolveHalfMessage(ctx, &txmqv1.ResolveHalfMessageRequest{MessageId: id, Resolution: txmqv1.Resolution_RESOLUTION_ROLLBACK})
	require.NoError(t, err)

	del, err := tb.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "orders"})
	require.NoError(t, err)
	require.False(t, del.DryRun)
	require.Equal(t, uint64(3), del.Topic.Messages)
	require.Equal(t, []string{"g"}, del.Topic.ConsumerGroups)
	require.Equal(t, uint64(3), del.ConsumerGroups[0].Lag)

	err = sub.waitEnd(5 * time.Second)
	require.Equal(t, codes.NotFound, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), `topic "orders" was deleted`)
	topics, err := tb.admin.ListTopics(ctx, &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	require.Empty(t, topics.Topics)
	_, err = tb.admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "g"})
	require.Equal(t, codes.NotFound, codeOf(err))

	_, err = tb.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "orders"})
	require.Equal(t, codes.NotFound, codeOf(err))
	_, err = tb.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "orders", DryRun: true})
	require.Equal(t, codes.NotFound, codeOf(err))
	_, err = tb.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "no such/name"})
	require.Equal(t, codes.InvalidArgument, codeOf(err))
}

func TestDeleteConsumerGroupAndItsMembers(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	sendN(t, tb, "orders", 2, nil)
	sendN(t, tb, "payments", 1, nil)
	three := uint32(3)
	_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{ConsumerGroup: "g", MaxDeliveries: &three}})
	require.NoError(t, err)
	require.NoError(t, subscribeStart(t, tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "g", MaxInFlight: 5, ClientId: "billing-1"}))
	sub := subscribe(t, tb, "payments", "g", 0)

	var members []*txmqv1.GroupMember
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		members = describe(t, tb, "g").Members
		if len(members) != 2 || members[0].InFlight != 2 {
			return fmt.Errorf("members %v", members)
		}
		return nil
	})
	m := members[0]
	require.Equal(t, "orders", m.Topic)
	require.Equal(t, "billing-1", m.ClientId)
	require.Contains(t, m.Address, "127.0.0.1:")
	require.Equal(t, uint32(5), m.MaxInFlight)
	require.WithinDuration(t, time.Now(), m.ConnectedAt.AsTime(), time.Minute)
	require.Equal(t, "payments", members[1].Topic)
	require.Empty(t, members[1].ClientId, "a client that sent no ID")

	dry, err := tb.admin.DeleteConsumerGroup(ctx, &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: "g", Topic: "orders", DryRun: true})
	require.NoError(t, err)
	require.Len(t, dry.Topics, 1)
	require.Equal(t, uint64(2), dry.Topics[0].Lag)
	require.Equal(t, uint32(2), dry.Topics[0].InFlight)
	require.False(t, dry.Policy, "the policy goes only with the whole group")
	_, err = tb.admin.DeleteConsumerGroup(ctx, &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: "g", Topic: "orders"})
	require.NoError(t, err)
	require.Len(t, describe(t, tb, "g").Topics, 1, "payments is left")

	dry, err = tb.admin.DeleteConsumerGroup(ctx, &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: "g", DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.Policy)
	require.Equal(t, "payments", dry.Topics[0].Topic)
	del, err := tb.admin.DeleteConsumerGroup(ctx, &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: "g"})
	require.NoError(t, err)
	require.True(t, del.Policy)
	require.Len(t, del.Topics, 1)
	require.Equal(t, uint64(1), del.Topics[0].Lag)

	err = sub.waitEnd(5 * time.Second)
	require.Equal(t, codes.NotFound, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), `consumer group "g" on topic "payments" was deleted`)
	_, err = tb.admin.DescribeConsumerGroup(ctx, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: "g"})
	require.Equal(t, codes.NotFound, codeOf(err))
	cfg, err := tb.admin.GetConsumerGroupConfig(ctx, &txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: "g"})
	require.NoError(t, err)
	require.Equal(t, uint32(DefaultMaxDeliveries), cfg.Config.GetMaxDeliveries(), "the policy went with the group")

	for name, req := range map[string]*txmqv1.DeleteConsumerGroupRequest{
		"deleted already":  {ConsumerGroup: "g"},
		"not on the topic": {ConsumerGroup: "nobody", Topic: "orders"},
		"no such topic":    {ConsumerGroup: "g", Topic: "missing", DryRun: true},
	} {
		_, err := tb.admin.DeleteConsumerGroup(ctx, req)
		require.Equal(t, codes.NotFound, codeOf(err), "%s: %v", name, err)
	}
	for name, req := range map[string]*txmqv1.DeleteConsumerGroupRequest{
		"no group":       {},
		"bad group name": {ConsumerGroup: "a b"},
		"bad topic name": {ConsumerGroup: "g", Topic: "a/b"},
	} {
		_, err := tb.admin.DeleteConsumerGroup(ctx, req)
		require.Equal(t, codes.InvalidArgument, codeOf(err), "%s: %v", name, err)
	}
	err = subscribeStart(t, tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "g", ClientId: string(make([]byte, 300))})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "a client ID over 256 bytes")
}

// Groups that subscriptions created and that nobody reads are listed as
// unused; groups an operator created are not.
func TestUnusedGroups(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	sendN(t, tb, "orders", 1, nil)
	typo := subscribe(t, tb, "orders", "biling", 0)
	subscribe(t, tb, "orders", "billing", 0)
	_, err := tb.admin.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "audit", Topic: "orders"})
	require.NoError(t, err)

	unusedNames := func() []string {
		list, err := tb.admin.ListConsumerGroups(ctx, &txmqv1.ListConsumerGroupsRequest{Unused: true})
		require.NoError(t, err)
		var names []string
		for _, g := range list.Groups {
			names = append(names, g.ConsumerGroup)
		}
		return names
	}
	require.Empty(t, unusedNames(), "both auto-created groups have a subscriber")
	typo.cancel()
	require.Error(t, typo.waitEnd(5*time.Second))
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := unusedNames(); len(got) != 1 || got[0] != "biling" {
			return fmt.Errorf("unused groups %v", got)
		}
		return nil
	})
	all, err := tb.admin.ListConsumerGroups(ctx, &txmqv1.ListConsumerGroupsRequest{})
	require.NoError(t, err)
	require.Len(t, all.Groups, 3)
	require.False(t, all.Groups[0].Topics[0].AutoCreated, "audit was created by an operator")
}

func TestSubscribeCreatesNothingWithoutAutoCreate(t *testing.T) {
	off := false
	tb := startBroker(t, func(cfg *Config) { cfg.AutoCreateTopics = &off })
	ctx := ctxT(t)
	err := subscribeStart(t, tb, &txmqv1.SubscriptionStart{Topic: "ordres", ConsumerGroup: "g"})
	require.Equal(t, codes.NotFound, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), `topic "ordres" does not exist`)
	require.Contains(t, err.Error(), "brokerctl topic create ordres")

	_, err = tb.admin.CreateTopic(ctx, &txmqv1.CreateTopicRequest{Name: "orders"})
	require.NoError(t, err)
	err = subscribeStart(t, tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "g"})
	require.Equal(t, codes.NotFound, codeOf(err), "%v", err)
	require.Contains(t, err.Error(), `consumer group "g" does not exist on topic "orders"`)
	require.Contains(t, err.Error(), "brokerctl group create g --topic orders")
	topics, err := tb.admin.ListTopics(ctx, &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	require.Len(t, topics.Topics, 1, "no topic created by the typo")
	require.Empty(t, topics.Topics[0].ConsumerGroups, "no group created")

	_, err = tb.producer.Send(ctx, &txmqv1.SendRequest{Topic: "orders", Body: []byte("old")})
	require.NoError(t, err)
	r, err := tb.admin.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "g", Topic: "orders", StartPosition: txmqv1.StartPosition_START_POSITION_LATEST})
	require.NoError(t, err)
	require.True(t, r.Created)
	require.Equal(t, "g", r.Group.ConsumerGroup)
	require.Equal(t, uint64(1), r.Group.AckedThrough, "starts after the last message")
	require.False(t, r.Group.AutoCreated)
	again, err := tb.admin.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "g", Topic: "orders"})
	require.NoError(t, err)
	require.False(t, again.Created, "an existing group is returned as it is")
	require.NoError(t, subscribeStart(t, tb, &txmqv1.SubscriptionStart{Topic: "orders", ConsumerGroup: "g"}))

	_, err = tb.admin.CreateConsumerGroup(ctx, &txmqv1.CreateConsumerGroupRequest{ConsumerGroup: "g", Topic: "missing"})
	require.Equal(t, codes.NotFound, codeOf(err))
	for name, req := range map[string]*txmqv1.CreateConsumerGroupRequest{
		"no group":            {Topic: "orders"},
		"no topic":            {ConsumerGroup: "g"},
		"timestamp, no time":  {ConsumerGroup: "g", Topic: "orders", StartPosition: txmqv1.StartPosition_START_POSITION_TIMESTAMP},
		"reserved topic name": {ConsumerGroup: "g", Topic: "txmq.internal"},
	} {
		_, err := tb.admin.CreateConsumerGroup(ctx, req)
		require.Equal(t, codes.InvalidArgument, codeOf(err), "%s: %v", name, err)
	}
}

func TestPurgeDryRun(t *testing.T) {
	tb := startBroker(t, nil)
	ctx := ctxT(t)
	one := uint32(1)
	_, err := tb.admin.SetConsumerGroupConfig(ctx, &txmqv1.SetConsumerGroupConfigRequest{Config: &txmqv1.ConsumerGroupConfig{ConsumerGroup: "g", MaxDeliveries: &one}})
	require.NoError(t, err)
	sendN(t, tb, "orders", 3, nil)
	sub := subscribe(t, tb, "orders", "g", 10)
	var ids []string
	for range 3 {
		d := sub.next(5 * time.Second)
		require.NotNil(t, d)
		ids = append(ids, d.MessageId)
	}
	sub.nack(nil, "poison", ids...)
	txmqtest.CheckFor(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := describe(t, tb, "g").Topics[0].DeadLetters; n != 3 {
			return fmt.Errorf("%d dead letters", n)
		}
		return nil
	})

	dry, err := tb.admin.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "g", All: true, DryRun: true})
	require.NoError(t, err)
	require.True(t, dry.DryRun)
	require.Equal(t, uint64(3), dry.Purged)
	require.Len(t, dry.DeadLetters, 3)
	require.Equal(t, "poison", dry.DeadLetters[0].LastError)
	require.Empty(t, dry.DeadLetters[0].Body, "no bodies in a listing")
	named, err := tb.admin.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "g", MessageIds: ids[1:2], DryRun: true})
	require.NoError(t, err)
	require.Equal(t, uint64(1), named.Purged)
	require.Equal(t, ids[1], named.DeadLetters[0].MessageId)
	require.Equal(t, uint64(3), describe(t, tb, "g").Topics[0].DeadLetters, "a dry run purges nothing")

	_, err = tb.admin.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "g", MessageIds: []string{unknownID}, DryRun: true})
	require.Equal(t, codes.NotFound, codeOf(err))
	_, err = tb.admin.PurgeDeadLetters(ctx, &txmqv1.PurgeDeadLettersRequest{ConsumerGroup: "g", DryRun: true})
	require.Equal(t, codes.InvalidArgument, codeOf(err), "neither IDs nor all")
}

// Deletions replicate: every node drops the same topic and group, and a
// new leader neither delivers nor knows them.
func TestClusterDeleteReplicates(t *testing.T) {
	c := newCluster(t, 3, nil)
	leader := c.Leader()
	ctx := ctxT(t)
	sendN(t, leader, "orders", 20, nil)
	sendN(t, leader, "payments", 5, nil)
	subscribe(t, leader, "orders", "g", 5)
	subscribe(t, leader, "payments", "g", 5)
	_, err := leader.admin.DeleteConsumerGroup(ctx, &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: "g", Topic: "payments"})
	require.NoError(t, err)
	_, err = leader.admin.DeleteTopic(ctx, &txmqv1.DeleteTopicRequest{Name: "orders"})
	require.NoError(t, err)
	c.VerifyStores()

	old := leader.Node().ID()
	c.Stop(old)
	leader = c.Leader()
	topics, err := leader.admin.ListTopics(ctx, &txmqv1.ListTopicsRequest{})
	require.NoError(t, err)
	require.Len(t, topics.Topics, 1)
	require.Equal(t, "payments", topics.Topics[0].Name)
	require.Empty(t, topics.Topics[0].ConsumerGroups)
	c.Start(old)
	c.VerifyStores()
}
