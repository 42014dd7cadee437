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
	fmt.Fprintln(tw, "TOPIC\tCREATED\tFIRST-SEQ\tLAST-SEQ\tMESSAGES\tBYTES\tCONSUMER-GROUPS")
	for _, t := range resp.GetTopics() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", t.GetName(), tableTime(t.GetCreatedAt()), t.GetFirstSequence(), t.GetLastSequence(),
			t.GetMessages(), t.GetBytes(), orDash(strings.Join(t.GetConsumerGroups(), ",")))
	}
	return tw.Flush()
}
