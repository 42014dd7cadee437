package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// Committed messages read without a consumer group and without acks, like
// nats stream get and mqadmin queryMsgById/queryMsgByKey: leader reads that
// change nothing.

// peekPoll is how often consume --peek asks for new messages once it has
// printed every one there is.
const peekPoll = 200 * time.Millisecond

func runMsgGet(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	id := fs.String("id", "", "the message `ID`, instead of TOPIC SEQ (with TOPIC alone: only that topic is searched)")
	pos, err := c.start(fs, args, "[TOPIC]", "[SEQ]")
	if err != nil {
		return err
	}
	req := &txmqv1.GetMessageRequest{MessageId: *id}
	switch {
	case *id != "" && len(pos) == 2:
		return c.usageError(fs, "give TOPIC SEQ or --id ID, not both")
	case *id == "" && len(pos) < 2:
		return c.usageError(fs, "name the message by TOPIC SEQ, or by --id ID")
	}
	if len(pos) > 0 {
		req.Topic = pos[0]
	}
	if len(pos) == 2 {
		if req.Sequence, err = strconv.ParseUint(pos[1], 10, 64); err != nil || req.Sequence == 0 {
			return c.usageError(fs, "SEQ must be a sequence number, 1 or more, not %q", pos[1])
		}
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetMessage, req)
	if err != nil {
		return err
	}
	m := resp.GetMessage()
	if c.jsonOutput() {
		return c.printJSON(newTopicMessageJSON(m, true))
	}
	fields := [][2]string{
		{"Message ID", m.GetMessageId()},
		{"Topic", m.GetTopic()},
		{"Sequence", strconv.FormatUint(m.GetSequence(), 10)},
		{"Committed", tableTime(m.GetCommittedAt())},
		{"Key", orDash(m.GetKey())},
		{"Ordering key", orDash(m.GetOrderingKey())},
		{"Producer group", orDash(m.GetProducerGroup())},
		{"Transaction ID", orDash(m.GetTransactionId())},
	}
	fields = append(fields, propertyFields(m.GetProperties())...)
	fields = append(fields, [2]string{"Body size", strconv.FormatUint(uint64(m.GetBodySize()), 10)})
	return printMessage(c.stdout, fields, m.GetBody())
}

func runMsgFind(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	key := fs.String("key", "", "the message `key` to look for (required)")
	topic := fs.String("topic", "", "only in this `topic`")
	limit := fs.Uint("limit", 0, "print at most `N` messages; 0 prints all")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	if *key == "" {
		return c.usageError(fs, "--key is required")
	}
	return printListing(c,
		"MSG-ID\tTOPIC\tSEQ\tCOMMITTED\tKEY\tORDERING-KEY\tBODY-SIZE",
		func(m *txmqv1.TopicMessage) string {
			return fmt.Sprintf("%s\t%s\t%d\t%s\t%s\t%s\t%d", m.GetMessageId(), m.GetTopic(), m.GetSequence(),
				tableTime(m.GetCommittedAt()), m.GetKey(), orDash(m.GetOrderingKey()), m.GetBodySize())
		},
		func(m *txmqv1.TopicMessage) any { return newTopicMessageJSON(m, false) },
		func(each func(*txmqv1.TopicMessage) error) error {
			return listPages(*limit, func(size uint32, token string) ([]*txmqv1.TopicMessage, string, error) {
				resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.FindMessages, &txmqv1.FindMessagesRequest{
					Key: *key, Topic: *topic, Limit: size, PageToken: token,
				})
				return resp.GetMessages(), resp.GetNextPageToken(), err
			}, each)
		})
}

// peek is consume --peek: it prints the committed messages of topic from
// start on (AdminService.ReadMessages), without a consumer group and
// without acks, until count were printed (when count > 0), no message came
// for wait, or ctx ends.
func peek(ctx context.Context, c *cli, topic string, start startFlag, count uint, wait time.Duration) error {
	req := &txmqv1.ReadMessagesRequest{Topic: topic, StartPosition: start.position, StartTime: start.time}
	n := uint(0)
	last := time.Now()
	for {
		if count > 0 {
			req.Limit = uint32(min(count-n, listPageSize))
		}
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ReadMessages, req)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		for _, m := range resp.GetMessages() {
			if err := printPeeked(c, m); err != nil {
				return err
			}
			n++
		}
		req = &txmqv1.ReadMessagesRequest{Topic: topic, FromSequence: resp.GetNextSequence(), Limit: req.Limit}
		switch {
		case count > 0 && n >= count:
			return nil
		case len(resp.GetMessages()) > 0:
			last = time.Now()
			continue
		}
		idle := time.Until(last.Add(wait))
		if idle <= 0 {
			return nil
		}
		select {
		case <-time.After(min(idle, peekPoll)):
		case <-ctx.Done():
			return nil
		}
	}
}

// printPeeked prints a message consume --peek read: as consume prints a
// delivery, with its sequence instead of an attempt.
func printPeeked(c *cli, m *txmqv1.TopicMessage) error {
	if c.jsonOutput() {
		return c.printJSON(newTopicMessageJSON(m, true))
	}
	line := fmt.Sprintf("%s  seq=%d  key=%s", m.GetMessageId(), m.GetSequence(), m.GetKey())
	if k := m.GetOrderingKey(); k != "" {
		line += "  ordering-key=" + k
	}
	_, err := fmt.Fprintf(c.stdout, "%s  %s\n", line, lineBody(m.GetBody()))
	return err
}
