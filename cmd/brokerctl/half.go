package main

import (
	"cmp"
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

// halfFilters are the filters of half list, and of half commit|rollback
// --all: the flags and the request they make.
type halfFilters struct {
	group, state, tx, topic *string
	olderThan               *time.Duration
}

func newHalfFilters(fs *flag.FlagSet) *halfFilters {
	return &halfFilters{
		group:     fs.String("group", "", "only this producer `group`"),
		state:     fs.String("state", "pending", "pending, committed, rolled-back, expired or all"),
		tx:        fs.String("tx", "", "only the message with this transaction `ID`"),
		topic:     fs.String("topic", "", "only messages of this `topic`"),
		olderThan: fs.Duration("older-than", 0, "only messages created at least this `long` ago, such as 1h"),
	}
}

// request is the listing the filters ask for, or a usage error.
func (f *halfFilters) request(c *cli, fs *flag.FlagSet) (*txmqv1.ListHalfMessagesRequest, error) {
	state, ok := halfStates[enumKey(*f.state)]
	switch {
	case !ok:
		return nil, c.usageError(fs, "--state must be pending, committed, rolled-back, expired or all, not %q", *f.state)
	case *f.olderThan < 0:
		return nil, c.usageError(fs, "--older-than must not be negative")
	}
	req := &txmqv1.ListHalfMessagesRequest{ProducerGroup: *f.group, State: state, TransactionId: *f.tx, Topic: *f.topic}
	if flagGiven(fs, "older-than") {
		req.OlderThan = durationpb.New(*f.olderThan)
	}
	return req, nil
}

func runHalfList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	filters := newHalfFilters(fs)
	limit := fs.Uint("limit", 0, "print at most `N` messages, then the token to go on with; 0 prints all")
	after := fs.String("after", "", "go on after this `token`, printed by a listing that --limit cut short")
	w := addWatchFlags(fs, 2*time.Second, "time between frames with --watch")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	if err := w.check(c, fs); err != nil {
		return err
	}
	req, err := filters.request(c, fs)
	if err != nil {
		return err
	}
	return c.repeat(ctx, w, func() error { return listHalf(ctx, c, req, *limit, *after) })
}

// listHalf prints one listing of half list, and the footer.
func listHalf(ctx context.Context, c *cli, req *txmqv1.ListHalfMessagesRequest, limit uint, after string) error {
	var shown, total uint64
	next := ""
	err := printListing(c, halfListHeader, halfListRow,
		func(m *txmqv1.HalfMessage) any { return newHalfJSON(m) },
		func(each func(*txmqv1.HalfMessage) error) error {
			return listPages(limit, func(size uint32, token string) ([]*txmqv1.HalfMessage, string, error) {
				page := proto.CloneOf(req)
				page.Limit, page.PageToken = size, cmp.Or(token, after)
				resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListHalfMessages, page)
				// Pages are sized to end at --limit: the last one's token
				// goes on after it.
				total, next = resp.GetTotal(), resp.GetNextPageToken()
				shown += uint64(len(resp.GetMessages()))
				return resp.GetMessages(), next, err
			}, each)
		})
	if err != nil {
		return err
	}
	return c.printFooter(listFooter(shown, max(total, shown), next))
}

const halfListHeader = "MSG-ID\tTOPIC\tPRODUCER-GROUP\tTX\tSTATE\tCREATED\tATTEMPTS\tNEXT-CHECK\tLAST-ERROR"

func halfListRow(m *txmqv1.HalfMessage) string {
	return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s",
		m.GetMessageId(), m.GetTopic(), m.GetProducerGroup(), m.GetTransactionId(), stateName(m.GetState()),
		tableTime(m.GetCreatedAt()), m.GetCheckAttempts(), tableTime(m.GetNextCheckAt()),
		tableCell(m.GetLastCheckError(), lastErrorWidth))
}

// listFooter sums up a listing that may be cut short: how many matched,
// and the token to go on with.
func listFooter(shown, total uint64, next string) string {
	if next == "" {
		return fmt.Sprintf("%d matching", total)
	}
	return fmt.Sprintf("%d of %d matching shown; go on with --after %s", shown, total, next)
}

// printFooter prints a line below a table. -o json prints none: its
// output stays one object per line (a listing's token to go on with is
// the ID of its last message).
func (c *cli) printFooter(line string) error {
	if c.jsonOutput() {
		return nil
	}
	_, err := fmt.Fprintln(c.stdout, line)
	return err
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
	ref := newHalfRefFlags(fs)
	pos, err := c.start(fs, args, "[MSG_ID]")
	if err != nil {
		return err
	}
	id, tr, err := ref.target(c, fs, pos)
	if err != nil {
		return err
	}
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetHalfMessage, &txmqv1.GetHalfMessageRequest{MessageId: id, Transaction: tr})
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

// halfRefFlags name a half message by --group and --tx instead of its ID.
type halfRefFlags struct{ group, tx *string }

func newHalfRefFlags(fs *flag.FlagSet) halfRefFlags {
	return halfRefFlags{
		group: fs.String("group", "", "with --tx: the producer `group` of the transaction"),
		tx:    fs.String("tx", "", "with --group: the transaction `ID`, instead of MSG_ID"),
	}
}

func (r halfRefFlags) target(c *cli, fs *flag.FlagSet, ids []string) (string, *txmqv1.TransactionRef, error) {
	return halfTarget(c, fs, ids, *r.group, *r.tx)
}

// halfTarget is the one half message named by ids, a single MSG_ID, or by
// group and tx: exactly one of the two.
func halfTarget(c *cli, fs *flag.FlagSet, ids []string, group, tx string) (string, *txmqv1.TransactionRef, error) {
	byTx := group != "" || tx != ""
	switch {
	case len(ids) > 0 && byTx:
		return "", nil, c.usageError(fs, "name the half message by MSG_ID or by --group and --tx, not both")
	case len(ids) == 1:
		return ids[0], nil, nil
	case len(ids) > 1:
		return "", nil, c.usageError(fs, "want one MSG_ID, got %d", len(ids))
	case group == "" || tx == "":
		return "", nil, c.usageError(fs, "name the half message by MSG_ID, or by --group G --tx TXID (both)")
	}
	return "", &txmqv1.TransactionRef{ProducerGroup: group, TransactionId: tx}, nil
}
