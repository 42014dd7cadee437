package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// listPageSize is what a listing asks for per call: the API's default
// page, which keeps a page far below the receive limit.
const listPageSize = 100

// lastErrorWidth bounds the LAST-ERROR columns of half list and dlq list;
// half show, dlq show and -o json print the whole error.
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
	w := addWatchFlags(fs, 2*time.Second, "time between frames with --watch")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	if err := w.check(c, fs); err != nil {
		return err
	}
	state, ok := halfStates[enumKey(*stateFlag)]
	if !ok {
		return c.usageError(fs, "--state must be pending, committed, rolled-back, expired or all, not %q", *stateFlag)
	}
	return c.repeat(ctx, w, func() error { return listHalf(ctx, c, *group, state, *limit) })
}

// listHalf prints one listing of half list.
func listHalf(ctx context.Context, c *cli, group string, state txmqv1.HalfState, limit uint) error {
	return printListing(c,
		"MSG-ID\tTOPIC\tPRODUCER-GROUP\tTX\tSTATE\tCREATED\tATTEMPTS\tNEXT-CHECK\tLAST-ERROR",
		func(m *txmqv1.HalfMessage) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s",
				m.GetMessageId(), m.GetTopic(), m.GetProducerGroup(), m.GetTransactionId(), stateName(m.GetState()),
				tableTime(m.GetCreatedAt()), m.GetCheckAttempts(), tableTime(m.GetNextCheckAt()),
				tableCell(m.GetLastCheckError(), lastErrorWidth))
		},
		func(m *txmqv1.HalfMessage) any { return newHalfJSON(m) },
		func(each func(*txmqv1.HalfMessage) error) error {
			return listPages(limit, func(size uint32, token string) ([]*txmqv1.HalfMessage, string, error) {
				resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListHalfMessages, &txmqv1.ListHalfMessagesRequest{
					ProducerGroup: group,
					State:         state,
					Limit:         size,
					PageToken:     token,
				})
				return resp.GetMessages(), resp.GetNextPageToken(), err
			}, each)
		})
}

// printListing prints the items list passes to its callback: as a table
// with header, a row per item, or as JSON, an object per line. The header
// goes out with the first row, or after an empty listing: a listing that
// fails at once prints only its error. Rows listed before a failure are
// printed too.
func printListing[T any](c *cli, header string, row func(T) string, toJSON func(T) any, list func(each func(T) error) error) error {
	if c.jsonOutput() {
		return list(func(item T) error { return c.printJSON(toJSON(item)) })
	}
	tw := newTable(c.stdout)
	headed := false
	err := list(func(item T) error {
		if !headed {
			headed = true
			fmt.Fprintln(tw, header)
		}
		_, err := fmt.Fprintln(tw, row(item))
		return err
	})
	if err == nil && !headed {
		fmt.Fprintln(tw, header)
	}
	if ferr := tw.Flush(); err == nil {
		err = ferr
	}
	return err
}

// listPages pages through a listing, passing at most limit items (all if
// 0) to each. page lists up to size items after token and returns the
// token of the next page, "" after the last one.
func listPages[T any](limit uint, page func(size uint32, token string) ([]T, string, error), each func(T) error) error {
	token := ""
	n := uint(0)
	for {
		size := uint(listPageSize)
		if limit > 0 {
			size = min(size, limit-n)
		}
		items, next, err := page(uint32(size), token)
		if err != nil {
			return err
		}
		for _, item := range items {
			if err := each(item); err != nil {
				return err
			}
			n++
			if n == limit {
				return nil
			}
		}
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
		{"Message ID", m.GetMessageId()},
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
	fields = append(fields, propertyFields(m.GetProperties())...)
	fields = append(fields, [2]string{"Body size", strconv.FormatUint(uint64(m.GetBodySize()), 10)})
	// A resolved message keeps no body here: it is in the topic log or gone.
	return printMessage(c.stdout, fields, m.GetBody())
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
	// A second check asks the producer again and counts another attempt,
	// or is refused once the first resolved the message.
	resp, err := adminCall(ctx, c, toLeaderOnce, txmqv1.AdminServiceClient.CheckHalfMessage, &txmqv1.CheckHalfMessageRequest{MessageId: pos[0]})
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
		{"Message ID", id},
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
