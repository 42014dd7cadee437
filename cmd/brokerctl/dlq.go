package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// dlqHeader and dlqRow are the columns of dlq list and a purge's plan.
const dlqHeader = "MSG-ID\tTOPIC\tSEQ\tATTEMPTS\tDEAD-AT\tLAST-ERROR\tKEY\tORDERING-KEY"

func dlqRow(dl *txmqv1.DeadLetter) string {
	return fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s", dl.GetMessageId(), dl.GetTopic(), dl.GetSequence(), dl.GetAttempts(),
		tableTime(dl.GetDeadAt()), tableCell(dl.GetLastError(), lastErrorWidth), orDash(dl.GetKey()), orDash(dl.GetOrderingKey()))
}

func runDLQList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	topic := fs.String("topic", "", "only the dead letters of this `topic`")
	limit := fs.Uint("limit", 0, "print at most `N` dead letters; 0 prints all")
	pos, err := c.start(fs, args, "GROUP")
	if err != nil {
		return err
	}
	if pos[0] == "" {
		return c.usageError(fs, "GROUP must not be empty")
	}
	return printListing(c, dlqHeader, dlqRow,
		func(dl *txmqv1.DeadLetter) any { return newDeadLetterJSON(dl, false) },
		func(each func(*txmqv1.DeadLetter) error) error {
			return listPages(*limit, func(size uint32, token string) ([]*txmqv1.DeadLetter, string, error) {
				resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListDeadLetters, &txmqv1.ListDeadLettersRequest{
					ConsumerGroup: pos[0],
					Topic:         *topic,
					Limit:         size,
					PageToken:     token,
				})
				return resp.GetDeadLetters(), resp.GetNextPageToken(), err
			}, each)
		})
}

func runDLQShow(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "GROUP", "MSG_ID")
	if err != nil {
		return err
	}
	if pos[0] == "" || pos[1] == "" {
		return c.usageError(fs, "GROUP and MSG_ID must not be empty")
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetDeadLetter, &txmqv1.GetDeadLetterRequest{ConsumerGroup: pos[0], MessageId: pos[1]})
	if err != nil {
		return err
	}
	dl := resp.GetDeadLetter()
	if c.jsonOutput() {
		return c.printJSON(newDeadLetterJSON(dl, true))
	}
	fields := [][2]string{
		{"Message ID", dl.GetMessageId()},
		{"Consumer group", dl.GetConsumerGroup()},
		{"Topic", dl.GetTopic()},
		{"Sequence", strconv.FormatUint(dl.GetSequence(), 10)},
		{"Attempts", strconv.FormatUint(uint64(dl.GetAttempts()), 10)},
		{"Dead at", tableTime(dl.GetDeadAt())},
		{"Last error", orDash(dl.GetLastError())},
		{"Committed", tableTime(dl.GetCommittedAt())},
		{"Key", orDash(dl.GetKey())},
		{"Ordering key", orDash(dl.GetOrderingKey())},
		{"Producer group", orDash(dl.GetProducerGroup())},
		{"Transaction ID", orDash(dl.GetTransactionId())},
	}
	fields = append(fields, propertyFields(dl.GetProperties())...)
	fields = append(fields, [2]string{"Body size", strconv.FormatUint(uint64(dl.GetBodySize()), 10)})
	return printMessage(c.stdout, fields, dl.GetBody())
}

func runDLQRedrive(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	sel, err := dlqSelection(c, fs, args, "redrive")
	if err != nil {
		return err
	}
	// Not safe to repeat: named dead letters are gone from the DLQ after the
	// first call (NotFound), and --all would take letters that died since.
	resp, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.RedriveDeadLetters, &txmqv1.RedriveDeadLettersRequest{
		ConsumerGroup: sel.group, MessageIds: sel.ids, All: sel.all, Topic: sel.topic,
	})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(redriveJSON{ConsumerGroup: sel.group, Redriven: resp.GetRedriven()})
	}
	_, err = fmt.Fprintf(c.stdout, "%d dead letter(s) of group %s redriven\n", resp.GetRedriven(), sel.group)
	return err
}

func runDLQPurge(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	dryRun := fs.Bool("dry-run", false, "list the dead letters that would be purged, and purge nothing")
	force := forceFlag(fs)
	sel, err := dlqSelection(c, fs, args, "purge")
	if err != nil {
		return err
	}
	if !*force || *dryRun {
		plan, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.PurgeDeadLetters, &txmqv1.PurgeDeadLettersRequest{
			ConsumerGroup: sel.group, MessageIds: sel.ids, All: sel.all, Topic: sel.topic, DryRun: true,
		})
		if err != nil {
			return err
		}
		if err := printPurgePlan(c, sel.group, plan); err != nil || *dryRun {
			return err
		}
		if err := confirm(c, fmt.Sprintf("purge %d dead letter(s) of group %s for good", plan.GetPurged(), sel.group)); err != nil {
			return err
		}
	}
	// Not safe to repeat, as a redrive.
	resp, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.PurgeDeadLetters, &txmqv1.PurgeDeadLettersRequest{
		ConsumerGroup: sel.group, MessageIds: sel.ids, All: sel.all, Topic: sel.topic,
	})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(purgeJSON{ConsumerGroup: sel.group, Purged: resp.GetPurged()})
	}
	_, err = fmt.Fprintf(c.stdout, "%d dead letter(s) of group %s purged\n", resp.GetPurged(), sel.group)
	return err
}

// printPurgePlan lists the dead letters a purge would delete, and how many.
func printPurgePlan(c *cli, group string, plan *txmqv1.PurgeDeadLettersResponse) error {
	if c.jsonOutput() {
		out := purgeJSON{ConsumerGroup: group, Purged: plan.GetPurged(), DryRun: true, DeadLetters: []deadLetterJSON{}}
		for _, dl := range plan.GetDeadLetters() {
			out.DeadLetters = append(out.DeadLetters, newDeadLetterJSON(dl, false))
		}
		return c.printJSON(out)
	}
	tw := newTable(c.stdout)
	fmt.Fprintln(tw, dlqHeader)
	for _, dl := range plan.GetDeadLetters() {
		fmt.Fprintln(tw, dlqRow(dl))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	more := ""
	if n := uint64(len(plan.GetDeadLetters())); n < plan.GetPurged() {
		more = fmt.Sprintf(" (the first %d listed)", n)
	}
	_, err := fmt.Fprintf(c.stdout, "%d dead letter(s) of group %s to purge%s\n", plan.GetPurged(), group, more)
	return err
}

// deadLetters are the dead letters dlq redrive or dlq purge acts on: the
// messages named, or with all every one of the group (of topic, if set).
type deadLetters struct {
	group string
	ids   []string
	all   bool
	topic string
}

// dlqSelection parses the arguments of dlq redrive and dlq purge. Either
// message IDs or --all must be given, explicitly: there is no default to
// every dead letter.
func dlqSelection(c *cli, fs *flag.FlagSet, args []string, verb string) (deadLetters, error) {
	all := fs.Bool("all", false, "every dead letter of the group (of --topic, if given) instead of the MSG_IDs named")
	topic := fs.String("topic", "", "with --all: only the dead letters of this `topic`")
	pos, err := c.start(fs, args, "GROUP", "[MSG_ID...]")
	if err != nil {
		return deadLetters{}, err
	}
	sel := deadLetters{group: pos[0], ids: pos[1:], all: *all, topic: *topic}
	switch {
	case sel.group == "":
		return deadLetters{}, c.usageError(fs, "GROUP must not be empty")
	case len(sel.ids) == 0 && !sel.all:
		return deadLetters{}, c.usageError(fs, "name the dead letters to %s, or give --all for every one", verb)
	case len(sel.ids) > 0 && sel.all:
		return deadLetters{}, c.usageError(fs, "give MSG_IDs or --all, not both")
	case len(sel.ids) > 0 && sel.topic != "":
		return deadLetters{}, c.usageError(fs, "--topic goes with --all; MSG_IDs name their messages already")
	}
	for _, id := range sel.ids {
		if id == "" {
			return deadLetters{}, c.usageError(fs, "MSG_ID must not be empty")
		}
	}
	return sel, nil
}
