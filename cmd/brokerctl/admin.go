package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func runTopicCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "NAME")
	if err != nil {
		return err
	}
	resp, err := unary(ctx, c, txmqv1.NewAdminServiceClient(c.conn).CreateTopic, &txmqv1.CreateTopicRequest{Name: pos[0]})
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
	resp, err := unary(ctx, c, txmqv1.NewAdminServiceClient(c.conn).ListTopics, &txmqv1.ListTopicsRequest{})
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
	resp, err := unary(ctx, c, txmqv1.NewAdminServiceClient(c.conn).DescribeConsumerGroup, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: pos[0]})
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

func runClusterStatus(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	resp, err := unary(ctx, c, txmqv1.NewAdminServiceClient(c.conn).ClusterStatus, &txmqv1.ClusterStatusRequest{})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		out := clusterJSON{
			NodeID:            resp.GetNodeId(),
			State:             resp.GetState(),
			LeaderID:          resp.GetLeaderId(),
			LeaderRaftAddress: resp.GetLeaderRaftAddress(),
			Term:              resp.GetTerm(),
			CommitIndex:       resp.GetCommitIndex(),
			AppliedIndex:      resp.GetAppliedIndex(),
			LastLogIndex:      resp.GetLastLogIndex(),
			StoreAppliedIndex: resp.GetStoreAppliedIndex(),
			Nodes:             []clusterNodeJSON{},
		}
		for _, n := range resp.GetNodes() {
			out.Nodes = append(out.Nodes, clusterNodeJSON{ID: n.GetId(), RaftAddress: n.GetRaftAddress(), Suffrage: n.GetSuffrage(), Leader: n.GetLeader()})
		}
		return c.printJSON(out)
	}
	leader := "-"
	if resp.GetLeaderId() != "" {
		leader = fmt.Sprintf("%s (%s)", resp.GetLeaderId(), resp.GetLeaderRaftAddress())
	}
	err = printFields(c.stdout, [][2]string{
		{"Node", resp.GetNodeId()},
		{"State", resp.GetState()},
		{"Leader", leader},
		{"Term", strconv.FormatUint(resp.GetTerm(), 10)},
		{"Commit index", strconv.FormatUint(resp.GetCommitIndex(), 10)},
		{"Applied index", strconv.FormatUint(resp.GetAppliedIndex(), 10)},
		{"Last log index", strconv.FormatUint(resp.GetLastLogIndex(), 10)},
		{"Store applied index", strconv.FormatUint(resp.GetStoreAppliedIndex(), 10)},
	})
	if err != nil {
		return err
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "\nID\tRAFT ADDRESS\tSUFFRAGE\tLEADER")
	for _, n := range resp.GetNodes() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\n", n.GetId(), n.GetRaftAddress(), n.GetSuffrage(), n.GetLeader())
	}
	return tw.Flush()
}
