package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/internal/bounds"
)

func runSend(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	key := fs.String("key", "", "producer message `key`: carried to consumers, and the dedup key")
	orderingKey := fs.String("ordering-key", "", "ordering `key`: messages of the topic with the same one are delivered to each consumer group in commit order, one at a time")
	props := propertiesFlag{}
	fs.Var(props, "prop", "message property `key=value`; repeatable")
	pos, err := c.start(fs, args, "TOPIC", "BODY")
	if err != nil {
		return err
	}
	body, err := c.messageBody(fs, pos[1])
	if err != nil {
		return err
	}
	resp, err := producerCall(ctx, c, sendRoute(*key), txmqv1.ProducerServiceClient.Send, &txmqv1.SendRequest{
		Topic:       pos[0],
		Key:         *key,
		Properties:  props,
		Body:        body,
		OrderingKey: *orderingKey,
	})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(sendJSON{ID: resp.GetMessageId(), Sequence: resp.GetSequence(), Duplicate: resp.GetDuplicate()})
	}
	if resp.GetDuplicate() {
		c.noteDuplicate(resp.GetMessageId(), fmt.Sprintf("key %q was sent to %s within the dedup window", *key, pos[0]))
	}
	_, err = fmt.Fprintln(c.stdout, resp.GetMessageId())
	return err
}

// noteDuplicate says, on stderr, that a write repeated an earlier one and
// stored nothing. stdout keeps only the ID, the first message's, so that
// ID=$(brokerctl ...) works alike for a first write and its repeat.
func (c *cli) noteDuplicate(id, why string) {
	fmt.Fprintf(c.stderr, "brokerctl: duplicate of message %s: %s; nothing new was stored\n", id, why)
}

func runHalfSend(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	group := fs.String("group", "", "producer `group` (required)")
	tx := fs.String("tx", "", "transaction `ID`, unique in the producer group: the idempotency key (required)")
	key := fs.String("key", "", "producer message `key`, carried to consumers")
	orderingKey := fs.String("ordering-key", "", "ordering `key`: once committed, messages of the topic with the same one are delivered to each consumer group in commit order, one at a time")
	props := propertiesFlag{}
	fs.Var(props, "prop", "message property `key=value`; repeatable")
	checkAfter := fs.Duration("check-after", 0, "when the first check-back is due, 1s to 1h (default: the broker's, 6s)")
	pos, err := c.start(fs, args, "TOPIC", "BODY")
	if err != nil {
		return err
	}
	body, err := c.messageBody(fs, pos[1])
	if err != nil {
		return err
	}
	switch {
	case *group == "":
		return c.usageError(fs, "--group is required")
	case *tx == "":
		return c.usageError(fs, "--tx is required")
	}
	req := &txmqv1.SendHalfRequest{
		Topic:         pos[0],
		ProducerGroup: *group,
		TransactionId: *tx,
		Key:           *key,
		Properties:    props,
		Body:          body,
		OrderingKey:   *orderingKey,
	}
	if flagGiven(fs, "check-after") {
		if *checkAfter <= 0 {
			return c.usageError(fs, "--check-after must be positive, not %s", *checkAfter)
		}
		req.CheckAfter = durationpb.New(*checkAfter)
	}
	resp, err := producerCall(ctx, c, toLeader, txmqv1.ProducerServiceClient.SendHalf, req)
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(halfSendJSON{ID: resp.GetMessageId(), Duplicate: resp.GetDuplicate(), State: stateName(resp.GetState())})
	}
	if resp.GetDuplicate() {
		c.noteDuplicate(resp.GetMessageId(), fmt.Sprintf("transaction %s of group %s was sent before (now %s)", *tx, *group, stateName(resp.GetState())))
	}
	_, err = fmt.Fprintln(c.stdout, resp.GetMessageId())
	return err
}

// messageBody is the BODY argument, or stdin when it is "-", up to the
// largest body a broker can be configured to take.
func (c *cli) messageBody(fs *flag.FlagSet, arg string) ([]byte, error) {
	if arg != "-" {
		return []byte(arg), nil
	}
	limit := bounds.MessageSize.Max
	b, err := io.ReadAll(io.LimitReader(c.stdin, int64(limit)+1))
	if err != nil {
		return nil, fmt.Errorf("reading the body from stdin: %w", err)
	}
	if len(b) > limit {
		return nil, c.usageError(fs, "the body on stdin is larger than %d bytes, the largest a broker takes", limit)
	}
	return b, nil
}

// sendRoute is where a plain Send goes: with a key the broker deduplicates
// a repeat, so it may be retried like any idempotent write; without one, a
// retry after an ambiguous failure could store the message twice.
func sendRoute(key string) route {
	if key != "" {
		return toLeader
	}
	return toLeaderOnce
}
