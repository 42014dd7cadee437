package main

import (
	"context"
	"encoding/base64"
	"flag"
	"fmt"
	"strconv"
	"text/tabwriter"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// halfPageSize is what half list asks for per call: the API's default page,
// which keeps a page of large pending bodies far below the receive limit.
const halfPageSize = 100

// lastErrorWidth bounds the LAST ERROR column of half list; half show and
// -o json print the whole error.
const lastErrorWidth = 40

var halfStates = map[string]txmqv1.HalfState{
	"pending":     txmqv1.HalfState_HALF_STATE_PENDING,
	"committed":   txmqv1.HalfState_HALF_STATE_COMMITTED,
	"rolled-back": txmqv1.HalfState_HALF_STATE_ROLLED_BACK,
	"expired":     txmqv1.HalfState_HALF_STATE_EXPIRED,
	"all":         txmqv1.HalfState_HALF_STATE_UNSPECIFIED,
}

func runHalfList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	group := fs.String("group", "", "only this producer `group`")
	stateFlag := fs.String("state", "pending", "pending, committed, rolled-back, expired or all")
	limit := fs.Uint("limit", 0, "print at most `N` messages; 0 prints all")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	state, ok := halfStates[*stateFlag]
	if !ok {
		return c.usageError(fs, "--state must be pending, committed, rolled-back, expired or all, not %q", *stateFlag)
	}
	emit := func(m *txmqv1.HalfMessage) error { return c.printJSON(newHalfJSON(m)) }
	var tw *tabwriter.Writer
	// The header goes out with the first row, or after an empty listing:
	// a failed call prints only its error.
	headed := false
	header := func() {
		headed = true
		fmt.Fprintln(tw, "ID\tTOPIC\tGROUP\tTX\tSTATE\tCREATED\tATTEMPTS\tNEXT CHECK\tLAST ERROR")
	}
	if !c.jsonOutput() {
		tw = newTable(c.stdout)
		emit = func(m *txmqv1.HalfMessage) error {
			if !headed {
				header()
			}
			_, err := fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n",
				m.GetMessageId(), m.GetTopic(), m.GetProducerGroup(), m.GetTransactionId(), stateName(m.GetState()),
				tableTime(m.GetCreatedAt()), m.GetCheckAttempts(), tableTime(m.GetNextCheckAt()),
				tableCell(m.GetLastCheckError(), lastErrorWidth))
			return err
		}
	}
	err := c.listHalf(ctx, *group, state, *limit, emit)
	if tw != nil {
		if err == nil && !headed {
			header()
		}
		// Print the rows listed before a failure too.
		if ferr := tw.Flush(); err == nil {
			err = ferr
		}
	}
	return err
}

// listHalf pages through the half messages of group (all groups if empty) in
// state, passing at most limit of them (all if 0) to each.
func (c *cli) listHalf(ctx context.Context, group string, state txmqv1.HalfState, limit uint, each func(*txmqv1.HalfMessage) error) error {
	token := ""
	n := uint(0)
	for {
		size := uint(halfPageSize)
		if limit > 0 {
			size = min(size, limit-n)
		}
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListHalfMessages, &txmqv1.ListHalfMessagesRequest{
			ProducerGroup: group,
			State:         state,
			Limit:         uint32(size),
			PageToken:     token,
		})
		if err != nil {
			return err
		}
		for _, m := range resp.GetMessages() {
			if err := each(m); err != nil {
				return err
			}
			n++
			if n == limit {
				return nil
			}
		}
		next := resp.GetNextPageToken()
		switch next {
		case "":
			return nil
		case token:
			return status.Errorf(codes.Internal, "the broker returned page token %q twice", next)
		}
		token = next
	}
}

func runHalfShow(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "MSG_ID")
	if err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetHalfMessage, &txmqv1.GetHalfMessageRequest{MessageId: pos[0]})
	if err != nil {
		return err
	}
	m := resp.GetMessage()
	if c.jsonOutput() {
		return c.printJSON(newHalfJSON(m))
	}
	fields := [][2]string{
		{"ID", m.GetMessageId()},
		{"Topic", m.GetTopic()},
		{"Producer group", m.GetProducerGroup()},
		{"Transaction ID", m.GetTransactionId()},
		{"Key", orDash(m.GetKey())},
		{"State", stateName(m.GetState())},
		{"Created", tableTime(m.GetCreatedAt())},
		{"Resolved", tableTime(m.GetResolvedAt())},
		{"Resolved by", orDash(sourceName(m.GetResolutionSource()))},
		{"Sequence", strconv.FormatUint(m.GetSequence(), 10)},
		{"Check attempts", strconv.FormatUint(uint64(m.GetCheckAttempts()), 10)},
		{"Next check", tableTime(m.GetNextCheckAt())},
		{"Last check error", orDash(m.GetLastCheckError())},
	}
	props := m.GetProperties()
	label := "Properties"
	if len(props) == 0 {
		fields = append(fields, [2]string{label, "-"})
	}
	for _, k := range sortedKeys(props) {
		fields = append(fields, [2]string{label, k + "=" + props[k]})
		label = ""
	}
	fields = append(fields, [2]string{"Body size", strconv.FormatUint(uint64(m.GetBodySize()), 10)})
	body := m.GetBody()
	if len(body) == 0 {
		// A resolved message keeps no body here: it is in the topic log or gone.
		fields = append(fields, [2]string{"Body", "-"})
	}
	if err := printFields(c.stdout, fields); err != nil || len(body) == 0 {
		return err
	}
	// The body goes below the table, where tabs and line breaks in it
	// cannot disturb the alignment.
	if utf8.Valid(body) {
		_, err = fmt.Fprintf(c.stdout, "Body:\n%s\n", body)
	} else {
		_, err = fmt.Fprintf(c.stdout, "Body (base64):\n%s\n", base64.StdEncoding.EncodeToString(body))
	}
	return err
}

// runHalfCheck runs a check-back now (AdminService.CheckHalfMessage) and
// prints the producer's answer, or why there is none, who was asked, and the
// message as it is afterwards. A check without an answer is still a success
// of the command: the answer is what it reports.
func runHalfCheck(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.start(fs, args, "MSG_ID")
	if err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.CheckHalfMessage, &txmqv1.CheckHalfMessageRequest{MessageId: pos[0]})
	if err != nil {
		return err
	}
	if c.jsonOutput() {
		return c.printJSON(newHalfCheckJSON(resp))
	}
	m := resp.GetMessage()
	id, state := pos[0], "-"
	if m != nil {
		id, state = m.GetMessageId(), stateName(m.GetState())
	}
	return printFields(c.stdout, [][2]string{
		{"ID", id},
		{"Answer", orDash(resolutionName(resp.GetAnswer()))},
		{"Error", orDash(resp.GetError())},
		{"Instance", orDash(resp.GetInstanceId())},
		{"Endpoint", orDash(resp.GetEndpoint())},
		{"State", state},
		{"Check attempts", strconv.FormatUint(uint64(m.GetCheckAttempts()), 10)},
		{"Next check", tableTime(m.GetNextCheckAt())},
	})
}

func runHalfCommit(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	return runHalfResolve(ctx, c, fs, args, txmqv1.Resolution_RESOLUTION_COMMIT)
}

func runHalfRollback(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	return runHalfResolve(ctx, c, fs, args, txmqv1.Resolution_RESOLUTION_ROLLBACK)
}

// runHalfResolve resolves a half message through AdminService, which unlike
// the producer's EndTransaction also resolves EXPIRED messages.
func runHalfResolve(ctx context.Context, c *cli, fs *flag.FlagSet, args []string, resolution txmqv1.Resolution) error {
	pos, err := c.start(fs, args, "MSG_ID")
	if err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ResolveHalfMessage, &txmqv1.ResolveHalfMessageRequest{
		MessageId:  pos[0],
		Resolution: resolution,
	})
	if err != nil {
		return err
	}
	m := resp.GetMessage()
	if c.jsonOutput() {
		return c.printJSON(newHalfJSON(m))
	}
	_, err = fmt.Fprintf(c.stdout, "%s %s\n", m.GetMessageId(), stateName(m.GetState()))
	return err
}
