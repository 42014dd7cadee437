package main

import (
	"context"
	"fmt"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// runClock restarts a follower with its clock skewed by the variant
// (--clock-offset, a testing flag of the broker), makes it the leader for
// the hold, so that it stamps times into commands and runs check-backs and
// retention by its clock, then hands leadership back and restarts it
// with the right clock. The checks are the usual ones: nothing lost (a
// retention sweep of fresh messages, or half messages expired en masse
// and never committed, would show as lost), no ghosts, nothing pending;
// the expired count is reported.
func runClock(ctx context.Context, x *Chaos, variant string, hold time.Duration) error {
	off, err := time.ParseDuration(variant)
	if err != nil {
		return err
	}
	id, err := x.pick(ctx, "follower")
	if err != nil {
		return err
	}
	n := x.c.node(id)
	return x.inject(fmt.Sprintf("clock %s on %s, made leader", variant, id), func() error {
		x.c.Stop(id)
		n.extra = []string{"--clock-offset", off.String()}
		defer func() { n.extra = nil }()
		if err := x.c.Start(id, nil); err != nil {
			return err
		}
		if err := x.waitMember(ctx, id); err != nil {
			return err
		}
		if err := x.transfer(ctx, id); err != nil {
			return err
		}
		sleep(ctx, hold)
		if err := x.transfer(ctx, ""); err != nil {
			x.logf("hand leadership back from %s: %v", id, err)
		}
		x.c.Stop(id)
		n.extra = nil
		return x.c.Start(id, nil)
	})
}

// transfer moves leadership to node to ("": away from the current leader,
// to the most up-to-date follower), retrying for 20 s.
func (x *Chaos) transfer(ctx context.Context, to string) error {
	from, _ := x.c.Leader(ctx)
	return retry(ctx, 20*time.Second, func() error {
		leader, err := x.c.Leader(ctx)
		if err != nil {
			return err
		}
		if (to != "" && leader == to) || (to == "" && leader != from) {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err = x.c.Admin(leader).TransferLeadership(cctx, &txmqv1.TransferLeadershipRequest{NodeId: to})
		if err == nil {
			err = fmt.Errorf("leadership moving from %s", leader)
		}
		return err
	})
}
