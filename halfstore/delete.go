package halfstore

import (
	"bytes"
	"fmt"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Deletion of topics and consumer groups, across the bucket families they
// reach: a topic's bucket (its log and its groups), a group's dead-letter
// index entries (dlq_ids), a topic's dedup keys (dedup, dedup_time) and a
// group's delivery policy (consumer_groups). Half messages are not
// touched: a topic is not deleted while one may still commit into it.

// OpenHalves counts the half messages of a topic that may still commit
// into it: PENDING ones, and EXPIRED ones an operator may commit. It reads
// every record in those two states (the state index has no topic).
func (t *Tx) OpenHalves(topic string) (int, error) {
	n := 0
	for _, st := range []storepb.HalfState{storepb.HalfState_HALF_STATE_PENDING, storepb.HalfState_HALF_STATE_EXPIRED} {
		prefix := []byte{byte(st)}
		c := t.tx.Bucket(bktHalfState).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			h, err := t.Half(string(k[1:]))
			if err != nil {
				return 0, err
			}
			if h.Topic == topic {
				n++
			}
		}
	}
	return n, nil
}

// DroppedGroup is a consumer group's progress on a topic as it was when it
// was deleted, with its lag then.
type DroppedGroup struct {
	Group *storepb.Group
	Lag   GroupLag
}

// dropped reads the groups about to be deleted with their lag.
func (t *Tx) dropped(groups []*storepb.Group) ([]DroppedGroup, error) {
	out := make([]DroppedGroup, len(groups))
	for i, g := range groups {
		lag, err := t.Lag(g.Topic, g.Name)
		if err != nil {
			return nil, err
		}
		out[i] = DroppedGroup{Group: g, Lag: lag}
	}
	return out, nil
}

// DeleteTopic deletes a topic: its log, its consumer groups with their
// acks, retry state and dead letters, and its dedup keys. It is refused
// with ErrConflict while half messages may commit into it (OpenHalves), and
// with ErrNotFound when there is no such topic. It returns the topic and
// its groups as they were.
func (t *Tx) DeleteTopic(name string) (*storepb.Topic, []DroppedGroup, error) {
	if err := checkName("topic name", name); err != nil {
		return nil, nil, err
	}
	tp, err := t.Topic(name)
	if err != nil {
		return nil, nil, err
	}
	open, err := t.OpenHalves(name)
	if err != nil {
		return nil, nil, err
	}
	if open > 0 {
		return nil, nil, fmt.Errorf("%w: topic %q has %d half message(s) PENDING or EXPIRED that would commit into it; commit or roll them back first (brokerctl half list --state pending|expired)", ErrConflict, name, open)
	}
	groups, err := t.Groups(name)
	if err != nil {
		return nil, nil, err
	}
	gone, err := t.dropped(groups)
	if err != nil {
		return nil, nil, err
	}
	for _, g := range groups {
		if err := t.dropDeadLetterIDs(name, g.Name); err != nil {
			return nil, nil, err
		}
	}
	if err := t.dropDedupKeys(name); err != nil {
		return nil, nil, err
	}
	return tp, gone, t.tx.Bucket(bktTopics).DeleteBucket([]byte(name))
}

// dropDedupKeys deletes a topic's Send dedup keys and their time entries.
func (t *Tx) dropDedupKeys(topic string) error {
	prefix := []byte(topic + "\x00")
	dedup := t.tx.Bucket(bktDedup)
	var keys [][]byte
	c := dedup.Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		keys = append(keys, bytes.Clone(k))
	}
	for _, dk := range keys {
		d := &storepb.Dedup{}
		if _, err := get(dedup, dk, d); err != nil {
			return err
		}
		if err := t.tx.Bucket(bktDedupTime).Delete(dedupTimeKey(d.SentAt, dk)); err != nil {
			return err
		}
		if err := dedup.Delete(dk); err != nil {
			return err
		}
	}
	return nil
}

// dropDeadLetterIDs deletes the dlq_ids entries of a group's dead letters
// on a topic.
func (t *Tx) dropDeadLetterIDs(topic, group string) error {
	gt, err := t.openGroup(topic, group)
	if err != nil {
		return err
	}
	ids := t.tx.Bucket(bktDLQIDs)
	return gt.eachDead(func(dl *storepb.DeadLetter) error {
		return ids.Delete(dlqIDKey(group, dl.GetMessage().GetId()))
	})
}

// DeleteGroup deletes a consumer group's progress, retry state and dead
// letters on one topic, or, with topic "", on every topic together with
// its delivery policy. It returns the group's progress as it was on each
// topic, with its lag, and whether a policy was deleted; ErrNotFound when
// there was nothing to delete.
func (t *Tx) DeleteGroup(group, topic string) ([]DroppedGroup, bool, error) {
	if err := checkName("consumer group", group); err != nil {
		return nil, false, err
	}
	var groups []*storepb.Group
	if topic != "" {
		g, err := t.Group(topic, group)
		if err != nil {
			return nil, false, err
		}
		groups = []*storepb.Group{g}
	} else {
		var err error
		if groups, err = t.GroupTopics(group); err != nil {
			return nil, false, err
		}
	}
	policy := false
	if topic == "" {
		policy = t.HasConsumerGroupPolicy(group)
	}
	if len(groups) == 0 && !policy {
		return nil, false, fmt.Errorf("%w: consumer group %q has no progress on any topic and no delivery policy", ErrNotFound, group)
	}
	gone, err := t.dropped(groups)
	if err != nil {
		return nil, false, err
	}
	for _, g := range groups {
		if err := t.dropDeadLetterIDs(g.Topic, group); err != nil {
			return nil, false, err
		}
		if err := t.topicBucket(g.Topic).Bucket(bktGroups).DeleteBucket([]byte(group)); err != nil {
			return nil, false, err
		}
	}
	if policy {
		if err := t.tx.Bucket(bktCGroups).Delete([]byte(group)); err != nil {
			return nil, false, err
		}
	}
	return gone, policy, nil
}
