package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func runTopicCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "NAME")
	if err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.CreateTopic, &txmqv1.CreateTopicRequest{Name: pos[0]})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(topicCreateJSON{topicJSON: newTopicJSON(resp.GetTopic()), Created: resp.GetCreated()})
	}
	outcome := "created"
	if !resp.GetCreated() {
		outcome = "exists already"
	}
	_, err = fmt.Fprintf(c.stdout, "topic %s %s\n", resp.GetTopic().GetName(), outcome)
	return err
}

func runTopicList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListTopics, &txmqv1.ListTopicsRequest{})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		for _, t := range resp.GetTopics() {
			if err := c.printJSON(newTopicJSON(t)); err != nil {
				return err
			}
		}
		return nil
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "NAME\tCREATED\tLAST SEQUENCE\tCONSUMER GROUPS")
	for _, t := range resp.GetTopics() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", t.GetName(), tableTime(t.GetCreatedAt()), t.GetLastSequence(), orDash(strings.Join(t.GetConsumerGroups(), ",")))
	}
	return tw.Flush()
}

func runGroupDescribe(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.DescribeConsumerGroup, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: pos[0]})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		out := groupJSON{ConsumerGroup: resp.GetConsumerGroup(), Topics: []groupTopicJSON{}}
		for _, t := range resp.GetTopics() {
			out.Topics = append(out.Topics, groupTopicJSON{
				Topic:        t.GetTopic(),
				AckedThrough: t.GetAckedThrough(),
				AckedAbove:   t.GetAckedAbove(),
				LastSequence: t.GetLastSequence(),
				Lag:          t.GetLag(),
				InFlight:     t.GetInFlight(),
				Subscribers:  t.GetSubscribers(),
				CreatedAt:    jsonTime(t.GetCreatedAt()),
			})
		}
		return c.printJSON(out)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "TOPIC\tACKED THROUGH\tACKED ABOVE\tLAST SEQUENCE\tLAG\tIN FLIGHT\tSUBSCRIBERS\tCREATED")
	for _, t := range resp.GetTopics() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", t.GetTopic(), t.GetAckedThrough(), t.GetAckedAbove(),
			t.GetLastSequence(), t.GetLag(), t.GetInFlight(), t.GetSubscribers(), tableTime(t.GetCreatedAt()))
	}
	return tw.Flush()
}
