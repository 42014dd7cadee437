package halfstore

import (
	"fmt"
	"time"

	"github.com/txmq/txmq/halfstore/storepb"
)

// Policies: producer groups' check-back policy (producer_groups) and
// consumer groups' delivery policy (consumer_groups). Zero fields mean the
// broker's defaults.

// ProducerGroup returns a producer group's check-back policy; a group
// without one gets an empty policy (all defaults).
func (t *Tx) ProducerGroup(name string) (*storepb.ProducerGroup, error) {
	pg := &storepb.ProducerGroup{}
	found, err := get(t.tx.Bucket(bktPGroups), []byte(name), pg)
	if err != nil {
		return nil, err
	}
	if !found {
		pg.Name = name
	}
	return pg, nil
}

// PutProducerGroup replaces a producer group's check-back policy. A cap of
// the check backoff below the backoff itself is refused when both are set.
func (t *Tx) PutProducerGroup(pg *storepb.ProducerGroup) error {
	if err := checkName("producer group", pg.Name); err != nil {
		return err
	}
	if pg.CheckBackoff > 0 && pg.MaxCheckBackoff > 0 && pg.MaxCheckBackoff < pg.CheckBackoff {
		return fmt.Errorf("halfstore: producer group %s: %w: max check backoff %s is below the check backoff %s",
			pg.Name, ErrInvalid, time.Duration(pg.MaxCheckBackoff), time.Duration(pg.CheckBackoff))
	}
	if _, ok := storepb.ExpiryAction_name[int32(pg.ExpiryAction)]; !ok {
		return fmt.Errorf("halfstore: producer group %s: %w: expiry action %d", pg.Name, ErrInvalid, pg.ExpiryAction)
	}
	return put(t.tx.Bucket(bktPGroups), []byte(pg.Name), pg)
}

// ConsumerGroup returns a consumer group's delivery policy; a group without
// one gets a record with only the name (all defaults).
func (t *Tx) ConsumerGroup(name string) (*storepb.ConsumerGroup, error) {
	cg := &storepb.ConsumerGroup{}
	found, err := get(t.tx.Bucket(bktCGroups), []byte(name), cg)
	if err != nil {
		return nil, err
	}
	if !found {
		cg.Name = name
	}
	return cg, nil
}

// PutConsumerGroup replaces a consumer group's delivery policy.
func (t *Tx) PutConsumerGroup(cg *storepb.ConsumerGroup) error {
	if err := checkName("consumer group", cg.Name); err != nil {
		return err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("halfstore: consumer group %s: %w: %s", cg.Name, ErrInvalid, fmt.Sprintf(format, args...))
	}
	if cg.AckDeadline < 0 {
		return bad("ack deadline %d is negative", cg.AckDeadline)
	}
	for _, d := range cg.RedeliveryBackoff {
		if d < 0 {
			return bad("redelivery backoff %d is negative", d)
		}
	}
	if _, ok := storepb.OrderedPoison_name[int32(cg.OrderedPoison)]; !ok {
		return bad("ordered poison policy %d is not 0 (default), 1 (skip) or 2 (hold)", cg.OrderedPoison)
	}
	return put(t.tx.Bucket(bktCGroups), []byte(cg.Name), cg)
}

// HasConsumerGroupPolicy reports whether a consumer group has a delivery
// policy of its own stored.
func (t *Tx) HasConsumerGroupPolicy(name string) bool {
	return t.tx.Bucket(bktCGroups).Get([]byte(name)) != nil
}
