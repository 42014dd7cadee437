package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// The ranges of a consumer group's delivery policy (admin.proto,
// ConsumerGroupConfig). The broker checks them too; brokerctl checks them
// first to say which flag is wrong.
const (
	maxMaxDeliveries = 1000
	minAckDeadline   = time.Second
	maxAckDeadline   = 12 * time.Hour
	maxBackoff       = 12 * time.Hour
)

var orderedPoisons = map[string]txmqv1.OrderedPoison{
	"skip": txmqv1.OrderedPoison_ORDERED_POISON_SKIP,
	"hold": txmqv1.OrderedPoison_ORDERED_POISON_HOLD,
}

// progressHeader and progressCells are the columns group list and group
// describe share: a group's progress on one topic, in the columns of
// kafka-consumer-groups --describe and RocketMQ's consumerProgress.
const progressHeader = "POSITION\tLAST-SEQ\tLAG\tLAG-AGE\tIN-FLIGHT\tREDELIVERIES\tRETRYING\tDLQ\tSUBSCRIBERS"

func progressCells(t *txmqv1.GroupTopicStatus) string {
	return fmt.Sprintf("%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d", t.GetAckedThrough(), t.GetLastSequence(), t.GetLag(),
		lagAge(t.GetLag(), t.GetLagAge()), t.GetInFlight(), t.GetRedeliveries(), t.GetRetrying(), t.GetDeadLetters(), t.GetSubscribers())
}

func runGroupList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	topic := fs.String("topic", "", "only this `topic`")
	unused := fs.Bool("unused", false, "only the groups subscriptions created (not brokerctl group create) that have no subscriber now: typos and abandoned consumers; brokerctl group delete removes one")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListConsumerGroups, &txmqv1.ListConsumerGroupsRequest{Topic: *topic, Unused: *unused})
	if err != nil {
		return err
	}
	tw := newTable(c.stdout)
	if !c.jsonOutput() {
		fmt.Fprintln(tw, "CONSUMER-GROUP\tTOPIC\t"+progressHeader)
	}
	for _, g := range resp.GetGroups() {
		for _, t := range g.GetTopics() {
			// A group of the topic may read others too: --topic shows
			// only the one asked for.
			if *topic != "" && t.GetTopic() != *topic {
				continue
			}
			if c.jsonOutput() {
				if err := c.printJSON(groupRowJSON{ConsumerGroup: g.GetConsumerGroup(), groupTopicJSON: newGroupTopicJSON(t)}); err != nil {
					return err
				}
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", g.GetConsumerGroup(), t.GetTopic(), progressCells(t))
		}
	}
	return tw.Flush()
}

func runGroupDescribe(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	members := fs.Bool("members", false, "list the group's subscribers too: client ID, address, deliveries in flight, connected since")
	w := addWatchFlags(fs, 2*time.Second, "time between frames with --watch")
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	if err := w.check(c, fs); err != nil {
		return err
	}
	return c.repeat(ctx, w, func() error {
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.DescribeConsumerGroup, &txmqv1.DescribeConsumerGroupRequest{ConsumerGroup: pos[0]})
		if err != nil {
			return err
		}
		return c.printGroup(resp, *members)
	})
}

// printGroup prints group describe's answer: the delivery policy, then the
// group's progress on each of its topics, and its subscribers with members.
func (c *cli) printGroup(resp *txmqv1.DescribeConsumerGroupResponse, members bool) error {
	if c.jsonOutput() {
		out := groupJSON{ConsumerGroup: resp.GetConsumerGroup(), Topics: []groupTopicJSON{}}
		for _, t := range resp.GetTopics() {
			out.Topics = append(out.Topics, newGroupTopicJSON(t))
		}
		if cfg := resp.GetConfig(); cfg != nil {
			cj := newConsumerConfigJSON(cfg)
			out.Config = &cj
		}
		if members {
			out.Members = []memberJSON{}
			for _, m := range resp.GetMembers() {
				out.Members = append(out.Members, newMemberJSON(m))
			}
		}
		return c.printJSON(out)
	}
	if err := printFields(c.stdout, consumerConfigFields("Consumer group", resp.GetConsumerGroup(), resp.GetConfig())); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(c.stdout); err != nil {
		return err
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "TOPIC\t"+progressHeader+"\tFIRST-SEQ\tDROPPED\tCREATED")
	for _, t := range resp.GetTopics() {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\n", t.GetTopic(), progressCells(t), t.GetFirstSequence(), t.GetDropped(), tableTime(t.GetCreatedAt()))
	}
	if err := tw.Flush(); err != nil || !members {
		return err
	}
	fmt.Fprintln(c.stdout)
	tw = newTable(c.stdout)
	fmt.Fprintln(tw, "TOPIC\tCLIENT-ID\tADDRESS\tIN-FLIGHT\tMAX-IN-FLIGHT\tCONNECTED-SINCE")
	for _, m := range resp.GetMembers() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", m.GetTopic(), orDash(m.GetClientId()), orDash(m.GetAddress()), m.GetInFlight(), m.GetMaxInFlight(), tableTime(m.GetConnectedAt()))
	}
	return tw.Flush()
}

// consumerConfigFields are the lines of the delivery policy of consumer
// group group, the first, its name, labelled label.
func consumerConfigFields(label, group string, cfg *txmqv1.ConsumerGroupConfig) [][2]string {
	maxDeliveries := "-"
	if cfg != nil && cfg.MaxDeliveries != nil {
		maxDeliveries = strconv.FormatUint(uint64(cfg.GetMaxDeliveries()), 10)
	}
	return [][2]string{
		{label, group},
		{"Max deliveries", maxDeliveries},
		{"Ack deadline", tableDuration(cfg.GetAckDeadline())},
		{"Redelivery backoff", tableBackoff(cfg.GetRedeliveryBackoff())},
		{"Ordered poison", orDash(poisonName(cfg.GetOrderedPoison()))},
	}
}

// consumerFlags are group config's settings of a consumer group's delivery
// policy.
type consumerFlags struct {
	maxDeliveries *uint
	ackDeadline   *time.Duration
	backoff       durationsFlag
	poison        *string
}

func addConsumerFlags(fs *flag.FlagSet) *consumerFlags {
	f := &consumerFlags{}
	f.maxDeliveries = fs.Uint("max-deliveries", 0, "consumer group: `N` deliveries of a message before it moves to the dead-letter queue, 1 to 1000 (default: the broker's, 16)")
	f.ackDeadline = fs.Duration("ack-deadline", 0, "consumer group: time to ack a delivery before it is redelivered, 1s to 12h (default: the broker's, 30s)")
	fs.Var(&f.backoff, "redelivery-backoff", "consumer group: `delays` before redelivery after the 1st, 2nd, ... failure, comma-separated, each 0s to 12h; the last one repeats")
	f.poison = fs.String("ordered-poison", "", "consumer group: what becomes of a message with an ordering key once its deliveries are used up: skip (dead-letter it, go on with its key; the broker's default) or hold (dead-letter it, hold its key until it is redriven or purged)")
	return f
}

// config returns the settings given on the command line for group, or nil
// when none was. A value out of range is a usage error.
func (f *consumerFlags) config(c *cli, fs *flag.FlagSet, group string) (*txmqv1.ConsumerGroupConfig, error) {
	cfg := &txmqv1.ConsumerGroupConfig{ConsumerGroup: group}
	change := false
	if flagGiven(fs, "max-deliveries") {
		if *f.maxDeliveries < 1 || *f.maxDeliveries > maxMaxDeliveries {
			return nil, c.usageError(fs, "--max-deliveries must be between 1 and %d, not %d", maxMaxDeliveries, *f.maxDeliveries)
		}
		cfg.MaxDeliveries = proto.Uint32(uint32(*f.maxDeliveries))
		change = true
	}
	if flagGiven(fs, "ack-deadline") {
		if *f.ackDeadline < minAckDeadline || *f.ackDeadline > maxAckDeadline {
			return nil, c.usageError(fs, "--ack-deadline must be between %s and %s, not %s", minAckDeadline, maxAckDeadline, *f.ackDeadline)
		}
		cfg.AckDeadline = durationpb.New(*f.ackDeadline)
		change = true
	}
	if flagGiven(fs, "redelivery-backoff") {
		for i, d := range f.backoff {
			if d < 0 || d > maxBackoff {
				return nil, c.usageError(fs, "--redelivery-backoff: delay %d (%s) must be between 0s and %s", i+1, d, maxBackoff)
			}
			cfg.RedeliveryBackoff = append(cfg.RedeliveryBackoff, durationpb.New(d))
		}
		change = true
	}
	if flagGiven(fs, "ordered-poison") {
		poison, ok := orderedPoisons[enumKey(*f.poison)]
		if !ok {
			return nil, c.usageError(fs, "--ordered-poison must be skip or hold, not %q", *f.poison)
		}
		cfg.OrderedPoison = poison
		change = true
	}
	if !change {
		return nil, nil
	}
	return cfg, nil
}

// runGroupConfig shows the delivery policy of consumer group GROUP and the
// check-back policy of producer group GROUP, or changes the settings given:
// the consumer group's with consumer flags, the producer group's with
// producer flags, both with both.
func runGroupConfig(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	consumer := addConsumerFlags(fs)
	producer := addProducerFlags(fs)
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	ccfg, err := consumer.config(c, fs, pos[0])
	if err != nil {
		return err
	}
	pcfg, err := producer.config(c, fs, pos[0])
	if err != nil {
		return err
	}
	if ccfg == nil && pcfg == nil {
		return showGroupConfigs(ctx, c, pos[0])
	}
	// Each result is printed once set, so that a failure of the second
	// leaves the first change on the screen.
	p := &configPrinter{c: c, qualify: ccfg != nil && pcfg != nil}
	if ccfg != nil {
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.SetConsumerGroupConfig, &txmqv1.SetConsumerGroupConfigRequest{Config: ccfg})
		if err != nil {
			return err
		}
		if err := p.consumer(resp.GetConfig()); err != nil {
			return err
		}
	}
	if pcfg != nil {
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.SetProducerGroupConfig, &txmqv1.SetProducerGroupConfigRequest{Config: pcfg})
		if err != nil {
			return err
		}
		return p.producer(resp.GetConfig())
	}
	return nil
}

// showGroupConfigs prints both policies of group. A name is often a group
// of one kind only: when the broker knows only one of the two, that one is
// printed alone.
func showGroupConfigs(ctx context.Context, c *cli, group string) error {
	cresp, cerr := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetConsumerGroupConfig, &txmqv1.GetConsumerGroupConfigRequest{ConsumerGroup: group})
	presp, perr := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetProducerGroupConfig, &txmqv1.GetProducerGroupConfigRequest{ProducerGroup: group})
	cmissing, pmissing := status.Code(cerr) == codes.NotFound, status.Code(perr) == codes.NotFound
	switch {
	case cmissing && pmissing:
		return status.Errorf(codes.NotFound, "%s; %s", status.Convert(cerr).Message(), status.Convert(perr).Message())
	case cerr != nil && !cmissing:
		return cerr
	case perr != nil && !pmissing:
		return perr
	}
	p := &configPrinter{c: c, qualify: cerr == nil && perr == nil}
	if cerr == nil {
		if err := p.consumer(cresp.GetConfig()); err != nil {
			return err
		}
	}
	if perr == nil {
		return p.producer(presp.GetConfig())
	}
	return nil
}

// configPrinter prints group config's sections one after the other: in a
// table, separated by an empty line and, when there are both, labelled
// "(delivery)" and "(check-back)"; in JSON, one object each.
type configPrinter struct {
	c       *cli
	qualify bool
	printed bool
}

func (p *configPrinter) consumer(cfg *txmqv1.ConsumerGroupConfig) error {
	if p.c.jsonOutput() {
		return p.c.printJSON(newConsumerConfigJSON(cfg))
	}
	label := "Consumer group"
	if p.qualify {
		label += " (delivery)"
	}
	return p.fields(consumerConfigFields(label, cfg.GetConsumerGroup(), cfg))
}

func (p *configPrinter) producer(cfg *txmqv1.ProducerGroupConfig) error {
	if p.c.jsonOutput() {
		return p.c.printJSON(newGroupConfigJSON(cfg))
	}
	label := "Producer group"
	if p.qualify {
		label += " (check-back)"
	}
	return p.fields(producerConfigFields(label, cfg))
}

func (p *configPrinter) fields(fields [][2]string) error {
	if p.printed {
		if _, err := fmt.Fprintln(p.c.stdout); err != nil {
			return err
		}
	}
	p.printed = true
	return printFields(p.c.stdout, fields)
}

func runGroupReset(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	var to startFlag
	fs.Var(&to, "to", "where the group goes: earliest, latest, or a `time`, RFC 3339 (2026-05-01T10:00:00Z) or back from now (-1h): the first message committed at or after it (required)")
	topic := fs.String("topic", "", "only on this `topic` (default: every topic of the group)")
	dryRun := fs.Bool("dry-run", false, "print what would change, and change nothing")
	force := forceFlag(fs)
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	switch {
	case pos[0] == "":
		return c.usageError(fs, "GROUP must not be empty")
	case !flagGiven(fs, "to"):
		return c.usageError(fs, "--to is required")
	}
	req := &txmqv1.ResetConsumerGroupRequest{ConsumerGroup: pos[0], Topic: *topic, To: to.position, Time: to.time, DryRun: true}
	if !*force && !*dryRun {
		// Show the plan, then ask.
		plan, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ResetConsumerGroup, req)
		if err != nil {
			return err
		}
		if err := printResets(c, pos[0], plan); err != nil {
			return err
		}
		if err := confirm(c, fmt.Sprintf("reset consumer group %s to %s on %d topic(s)", pos[0], to.text, len(plan.GetTopics()))); err != nil {
			return err
		}
	}
	// A reset done twice moves the group back twice, over what it consumed
	// in between; a dry run changes nothing.
	r := toLeaderOnce
	if *dryRun {
		r = toLeader
	}
	req.DryRun = *dryRun
	resp, err := adminCall(ctx, c, r, txmqv1.AdminServiceClient.ResetConsumerGroup, req)
	if err != nil {
		return err
	}
	if err := printResets(c, pos[0], resp); err != nil {
		return err
	}
	if c.jsonOutput() {
		return nil
	}
	if resp.GetDryRun() {
		_, err = fmt.Fprintf(c.stdout, "Dry run: nothing changed. Without --dry-run, the connected subscribers of group %s are disconnected and resubscribe at the new position.\n", pos[0])
	} else {
		_, err = fmt.Fprintf(c.stdout, "Group %s reset on %d topic(s). Its connected subscribers were disconnected and resubscribe at the new position.\n", pos[0], len(resp.GetTopics()))
	}
	return err
}

// printResets prints a reset's moves, one per topic.
func printResets(c *cli, group string, resp *txmqv1.ResetConsumerGroupResponse) error {
	if c.jsonOutput() {
		for _, r := range resp.GetTopics() {
			err := c.printJSON(resetJSON{
				ConsumerGroup:   group,
				Topic:           r.GetTopic(),
				OldAckedThrough: r.GetOldAckedThrough(),
				NewAckedThrough: r.GetNewAckedThrough(),
				LagBefore:       r.GetLagBefore(),
				LagAfter:        r.GetLagAfter(),
				DryRun:          resp.GetDryRun(),
			})
			if err != nil {
				return err
			}
		}
		return nil
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, "TOPIC\tOLD-POSITION\tNEW-POSITION\tLAG-BEFORE\tLAG-AFTER")
	for _, r := range resp.GetTopics() {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\n", r.GetTopic(), r.GetOldAckedThrough(), r.GetNewAckedThrough(), r.GetLagBefore(), r.GetLagAfter())
	}
	return tw.Flush()
}
