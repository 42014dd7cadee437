package main

import (
	"context"
	"flag"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// Creating consumer groups, and deleting topics and consumer groups. A
// deletion first shows what it drops (the broker's dry run), then asks on
// the terminal unless -f; --dry-run stops after showing.

// droppedHeader and droppedCells are the columns of the groups a deletion
// drops: their lag and dead letters are lost with them.
const droppedHeader = "GROUP\tTOPIC\tLAG\tDLQ\tIN-FLIGHT\tSUBSCRIBERS\tAUTO-CREATED"

func droppedCells(t *txmqv1.GroupTopicStatus) string {
	return fmt.Sprintf("%s\t%s\t%d\t%d\t%d\t%d\t%t", t.GetConsumerGroup(), t.GetTopic(), t.GetLag(), t.GetDeadLetters(),
		t.GetInFlight(), t.GetSubscribers(), t.GetAutoCreated())
}

// printDropped prints a deletion's groups as a table, or nothing when
// there are none.
func printDropped(c *cli, groups []*txmqv1.GroupTopicStatus) error {
	if len(groups) == 0 {
		return nil
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, droppedHeader)
	for _, g := range groups {
		fmt.Fprintln(tw, droppedCells(g))
	}
	return tw.Flush()
}

// dropTotals sums the lag and dead letters of the groups a deletion drops.
func dropTotals(groups []*txmqv1.GroupTopicStatus) (lag, dead uint64) {
	for _, g := range groups {
		lag += g.GetLag()
		dead += g.GetDeadLetters()
	}
	return lag, dead
}

func newDroppedJSON(groups []*txmqv1.GroupTopicStatus) []groupRowJSON {
	out := []groupRowJSON{}
	for _, g := range groups {
		out = append(out, groupRowJSON{ConsumerGroup: g.GetConsumerGroup(), groupTopicJSON: newGroupTopicJSON(g)})
	}
	return out
}

func runTopicDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	dryRun := fs.Bool("dry-run", false, "show what would be deleted, and delete nothing")
	force := forceFlag(fs)
	pos, err := c.start(fs, args, "NAME")
	if err != nil {
		return err
	}
	name := pos[0]
	if name == "" {
		return c.usageError(fs, "NAME must not be empty")
	}
	if !*force || *dryRun {
		plan, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.DeleteTopic, &txmqv1.DeleteTopicRequest{Name: name, DryRun: true})
		if err != nil {
			return err
		}
		if err := printTopicDelete(c, plan); err != nil || *dryRun {
			return err
		}
		if n := plan.GetPendingHalfMessages(); n > 0 {
			return status.Errorf(codes.FailedPrecondition, "topic %s has %d half message(s) PENDING or EXPIRED that would commit into it; commit or roll them back first (brokerctl half list --state pending|expired); nothing deleted", name, n)
		}
		_, dead := dropTotals(plan.GetConsumerGroups())
		if err := confirm(c, fmt.Sprintf("delete topic %s with its %d message(s), %d consumer group(s) and their %d dead letter(s)",
			name, plan.GetTopic().GetMessages(), len(plan.GetConsumerGroups()), dead)); err != nil {
			return err
		}
	}
	// Repeated after it took effect, a deletion fails with NotFound.
	resp, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.DeleteTopic, &txmqv1.DeleteTopicRequest{Name: name})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return printTopicDelete(c, resp)
	}
	t := resp.GetTopic()
	_, err = fmt.Fprintf(c.stdout, "topic %s deleted: %d message(s), %d byte(s), %d consumer group(s)\n", name, t.GetMessages(), t.GetBytes(), len(resp.GetConsumerGroups()))
	return err
}

// printTopicDelete prints what a topic deletion drops (or dropped).
func printTopicDelete(c *cli, r *txmqv1.DeleteTopicResponse) error {
	t := r.GetTopic()
	if c.jsonOutput() {
		return c.printJSON(topicDeleteJSON{
			Topic:               newTopicJSON(t),
			Groups:              newDroppedJSON(r.GetConsumerGroups()),
			PendingHalfMessages: r.GetPendingHalfMessages(),
			DryRun:              r.GetDryRun(),
		})
	}
	seqs := "-"
	if t.GetMessages() > 0 {
		seqs = fmt.Sprintf("%d to %d", t.GetFirstSequence(), t.GetLastSequence())
	}
	err := printFields(c.stdout, [][2]string{
		{"Topic", t.GetName()},
		{"Messages", fmt.Sprintf("%d (sequences %s)", t.GetMessages(), seqs)},
		{"Bytes", fmt.Sprint(t.GetBytes())},
		{"Consumer groups", fmt.Sprint(len(r.GetConsumerGroups()))},
		{"Pending half messages", fmt.Sprintf("%d (PENDING or EXPIRED; the topic is not deleted while there are any)", r.GetPendingHalfMessages())},
	})
	if err != nil {
		return err
	}
	if len(r.GetConsumerGroups()) > 0 {
		fmt.Fprintln(c.stdout)
	}
	if err := printDropped(c, r.GetConsumerGroups()); err != nil {
		return err
	}
	if r.GetDryRun() {
		_, err = fmt.Fprintf(c.stdout, "Deleting topic %s drops all of the above; its subscribers are disconnected.\n", t.GetName())
	}
	return err
}

func runGroupCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	topic := fs.String("topic", "", "the `topic` the group reads (required)")
	start := startFlag{text: "earliest", position: txmqv1.StartPosition_START_POSITION_EARLIEST}
	fs.Var(&start, "start", "where the group starts: earliest, latest, or a `time`, RFC 3339 (2026-05-01T10:00:00Z) or back from now (-1h)")
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	switch {
	case pos[0] == "":
		return c.usageError(fs, "GROUP must not be empty")
	case *topic == "":
		return c.usageError(fs, "--topic is required")
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.CreateConsumerGroup, &txmqv1.CreateConsumerGroupRequest{
		ConsumerGroup: pos[0], Topic: *topic, StartPosition: start.position, StartTime: start.time,
	})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(groupCreateJSON{groupRowJSON: groupRowJSON{ConsumerGroup: pos[0], groupTopicJSON: newGroupTopicJSON(resp.GetGroup())}, Created: resp.GetCreated()})
	}
	outcome := fmt.Sprintf("created at position %d", resp.GetGroup().GetAckedThrough())
	if !resp.GetCreated() {
		outcome = fmt.Sprintf("exists already, at position %d", resp.GetGroup().GetAckedThrough())
	}
	_, err = fmt.Fprintf(c.stdout, "consumer group %s on topic %s %s\n", pos[0], *topic, outcome)
	return err
}

func runGroupDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	topic := fs.String("topic", "", "only on this `topic` (default: on every topic, with the group's delivery policy)")
	dryRun := fs.Bool("dry-run", false, "show what would be deleted, and delete nothing")
	force := forceFlag(fs)
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	if pos[0] == "" {
		return c.usageError(fs, "GROUP must not be empty")
	}
	req := &txmqv1.DeleteConsumerGroupRequest{ConsumerGroup: pos[0], Topic: *topic}
	if !*force || *dryRun {
		req.DryRun = true
		plan, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.DeleteConsumerGroup, req)
		if err != nil {
			return err
		}
		if err := printGroupDelete(c, plan); err != nil || *dryRun {
			return err
		}
		lag, dead := dropTotals(plan.GetTopics())
		if err := confirm(c, fmt.Sprintf("delete consumer group %s on %d topic(s), with its lag of %d message(s) and %d dead letter(s)",
			pos[0], len(plan.GetTopics()), lag, dead)); err != nil {
			return err
		}
		req.DryRun = false
	}
	resp, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.DeleteConsumerGroup, req)
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return printGroupDelete(c, resp)
	}
	policy := ""
	if resp.GetPolicy() {
		policy = " and its delivery policy"
	}
	_, err = fmt.Fprintf(c.stdout, "consumer group %s deleted on %d topic(s)%s\n", pos[0], len(resp.GetTopics()), policy)
	return err
}

// printGroupDelete prints what a group deletion drops (or dropped).
func printGroupDelete(c *cli, r *txmqv1.DeleteConsumerGroupResponse) error {
	if c.jsonOutput() {
		return c.printJSON(groupDeleteJSON{ConsumerGroup: r.GetConsumerGroup(), Topics: newDroppedJSON(r.GetTopics()), Policy: r.GetPolicy(), DryRun: r.GetDryRun()})
	}
	if err := printDropped(c, r.GetTopics()); err != nil {
		return err
	}
	if r.GetPolicy() {
		if _, err := fmt.Fprintf(c.stdout, "Delivery policy of %s: deleted with the group (back to the broker's defaults).\n", r.GetConsumerGroup()); err != nil {
			return err
		}
	}
	if !r.GetDryRun() {
		return nil
	}
	_, err := fmt.Fprintf(c.stdout, "Deleting consumer group %s drops all of the above; its subscribers are disconnected.\n", r.GetConsumerGroup())
	return err
}
