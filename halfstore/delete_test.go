package halfstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

// deleteFixture is topic "orders" with three keyed messages, groups g
// (one dead letter, one ack) and h, and group g on "payments" too, with a
// delivery policy of its own.
func deleteFixture(t *testing.T) *Store {
	t.Helper()
	s := openStore(t)
	for i, id := range []string{"m1", "m2", "m3"} {
		send(t, s, "orders", id, "k-"+id, 60*sec, t0+int64(i)*sec)
	}
	send(t, s, "payments", "p1", "", 0, t0)
	createGroup(t, s, "orders", "g", GroupStart{})
	createGroup(t, s, "orders", "h", GroupStart{})
	createGroup(t, s, "payments", "g", GroupStart{})
	_, err := fail(t, s, "orders", "g", t0, deadOf(2, 16))
	require.NoError(t, err)
	update(t, s, func(tx *Tx) error {
		if _, err := tx.Ack("orders", "g", []uint64{1}, nil); err != nil {
			return err
		}
		return tx.PutConsumerGroup(&storepb.ConsumerGroup{Name: "g", MaxDeliveries: 3})
	})
	return s
}

func deleteTopic(t *testing.T, s *Store, name string) (*storepb.Topic, []DroppedGroup, error) {
	t.Helper()
	var tp *storepb.Topic
	var gone []DroppedGroup
	var derr error
	update(t, s, func(tx *Tx) error {
		tp, gone, derr = tx.DeleteTopic(name)
		return nil
	})
	return tp, gone, derr
}

func deleteGroup(t *testing.T, s *Store, group, topic string) ([]DroppedGroup, bool, error) {
	t.Helper()
	var gone []DroppedGroup
	var policy bool
	var derr error
	update(t, s, func(tx *Tx) error {
		gone, policy, derr = tx.DeleteGroup(group, topic)
		return nil
	})
	return gone, policy, derr
}

func TestDeleteTopicRefusedWhileHalfMessagesMayCommitIntoIt(t *testing.T) {
	s := deleteFixture(t)
	putHalf(t, s, half("h1", "shop", "tx-1"))
	before := dump(t, s)
	_, _, err := deleteTopic(t, s, "orders")
	require.ErrorIs(t, err, ErrConflict)
	require.ErrorContains(t, err, `topic "orders" has 1 half message(s) PENDING or EXPIRED`)
	require.Equal(t, before, dump(t, s), "a refused delete wrote something")

	_, err = expire(t, s, "h1", t0+sec)
	require.NoError(t, err)
	_, _, err = deleteTopic(t, s, "orders")
	require.ErrorIs(t, err, ErrConflict, "an EXPIRED half message may still be committed by an operator")

	_, err = resolve(t, s, "h1", Rollback, storepb.Source_SOURCE_OPERATOR, t0+2*sec)
	require.NoError(t, err)
	view(t, s, func(tx *Tx) error {
		n, err := tx.OpenHalves("orders")
		require.Zero(t, n)
		return err
	})
	_, _, err = deleteTopic(t, s, "orders")
	require.NoError(t, err, "a rolled-back half message does not hold the topic")
}

func TestDeleteTopicDropsItsLogGroupsDeadLettersAndDedupKeys(t *testing.T) {
	s := deleteFixture(t)
	tp, gone, err := deleteTopic(t, s, "orders")
	require.NoError(t, err)
	require.Equal(t, uint64(3), tp.LastSequence)
	require.Len(t, gone, 2)
	require.Equal(t, "g", gone[0].Group.Name)
	require.Equal(t, uint64(1), gone[0].Group.DeadLetters)
	require.Equal(t, uint64(1), gone[0].Lag.Lag, "g acked 1, dead-lettered 2: 3 is left")
	require.Equal(t, "h", gone[1].Group.Name)
	require.Equal(t, uint64(3), gone[1].Lag.Lag)

	view(t, s, func(tx *Tx) error {
		_, err := tx.Topic("orders")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.DeadLetterByID("g", "m2")
		require.ErrorIs(t, err, ErrNotFound)
		for _, b := range [][]byte{bktDLQIDs, bktDedup, bktDedupTime} {
			require.Zero(t, tx.tx.Bucket(b).Stats().KeyN, "bucket %s still has entries", b)
		}
		g, err := tx.Group("payments", "g")
		require.NoError(t, err, "the group's progress on another topic stays")
		require.Equal(t, "g", g.Name)
		require.True(t, tx.HasConsumerGroupPolicy("g"), "the group's policy stays: it reads another topic")
		return nil
	})
	// A key sent before the deletion is new to a topic of the same name.
	m, dup := send(t, s, "orders", "m4", "k-m1", 60*sec, t0+5*sec)
	require.False(t, dup)
	require.Equal(t, uint64(1), m.Sequence)
}

func TestDeleteTopicBadInput(t *testing.T) {
	s := deleteFixture(t)
	_, _, err := deleteTopic(t, s, "missing")
	require.ErrorIs(t, err, ErrNotFound)
	_, _, err = deleteTopic(t, s, "")
	require.ErrorIs(t, err, ErrInvalid)
}

func TestDeleteGroupOnOneTopicThenEverywhere(t *testing.T) {
	s := deleteFixture(t)
	gone, policy, err := deleteGroup(t, s, "g", "orders")
	require.NoError(t, err)
	require.False(t, policy, "the policy goes only with the whole group")
	require.Len(t, gone, 1)
	require.Equal(t, "orders", gone[0].Group.Topic)
	view(t, s, func(tx *Tx) error {
		_, err := tx.Group("orders", "g")
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.DeadLetterByID("g", "m2")
		require.ErrorIs(t, err, ErrNotFound)
		require.Zero(t, tx.tx.Bucket(bktDLQIDs).Stats().KeyN)
		return nil
	})
	checkGroup(t, s, "orders", "h")

	gone, policy, err = deleteGroup(t, s, "g", "")
	require.NoError(t, err)
	require.True(t, policy)
	require.Len(t, gone, 1)
	require.Equal(t, "payments", gone[0].Group.Topic)
	view(t, s, func(tx *Tx) error {
		require.False(t, tx.HasConsumerGroupPolicy("g"))
		groups, err := tx.GroupTopics("g")
		require.Empty(t, groups)
		return err
	})

	_, _, err = deleteGroup(t, s, "g", "")
	require.ErrorIs(t, err, ErrNotFound, "deleting it again")
	_, _, err = deleteGroup(t, s, "h", "payments")
	require.ErrorIs(t, err, ErrNotFound, "h does not read payments")
	_, _, err = deleteGroup(t, s, "", "")
	require.ErrorIs(t, err, ErrInvalid)
}

func TestDeleteGroupWithOnlyAPolicy(t *testing.T) {
	s := openStore(t)
	update(t, s, func(tx *Tx) error {
		return tx.PutConsumerGroup(&storepb.ConsumerGroup{Name: "later", MaxDeliveries: 5})
	})
	gone, policy, err := deleteGroup(t, s, "later", "")
	require.NoError(t, err)
	require.True(t, policy)
	require.Empty(t, gone)
}

func TestCreateGroupMarksAutoCreated(t *testing.T) {
	s := deleteFixture(t)
	update(t, s, func(tx *Tx) error {
		g, created, err := tx.CreateGroup("orders", "auto", GroupStart{}, t0, true)
		require.True(t, created)
		require.True(t, g.AutoCreated)
		return err
	})
	require.True(t, getGroup(t, s, "orders", "auto").AutoCreated)
	require.False(t, getGroup(t, s, "orders", "h").AutoCreated)
}
