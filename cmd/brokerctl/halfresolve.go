package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

func runHalfCommit(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	return runHalfResolve(ctx, c, fs, args, txmqv1.Resolution_RESOLUTION_COMMIT)
}

func runHalfRollback(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	return runHalfResolve(ctx, c, fs, args, txmqv1.Resolution_RESOLUTION_ROLLBACK)
}

// runHalfResolve resolves half messages as an operator
// (AdminService.ResolveHalfMessage, which unlike the producer's
// EndTransaction also resolves EXPIRED messages): the MSG_IDs named, the
// one of --group and --tx, or with --all each one half list lists with the
// same filters. Each is resolved on its own and its result printed; the
// command fails when one of them failed.
func runHalfResolve(ctx context.Context, c *cli, fs *flag.FlagSet, args []string, resolution txmqv1.Resolution) error {
	filters := newHalfFilters(fs)
	all := fs.Bool("all", false, "every half message the filters select, as half list lists them; --state pending (the default) or expired")
	dryRun := fs.Bool("dry-run", false, "list the messages it would resolve, and change nothing")
	force := forceFlag(fs)
	pos, err := c.start(fs, args, "[MSG_ID...]")
	if err != nil {
		return err
	}
	if !*all {
		for _, name := range []string{"state", "topic", "older-than"} {
			if flagGiven(fs, name) {
				return c.usageError(fs, "--%s goes with --all", name)
			}
		}
		return resolveNamed(ctx, c, fs, pos, filters, resolution, *dryRun)
	}
	if len(pos) > 0 {
		return c.usageError(fs, "give MSG_IDs or --all, not both")
	}
	req, err := filters.request(c, fs)
	if err != nil {
		return err
	}
	if s := req.GetState(); s != txmqv1.HalfState_HALF_STATE_PENDING && s != txmqv1.HalfState_HALF_STATE_EXPIRED {
		return c.usageError(fs, "with --all, --state must be pending or expired: only those can be resolved")
	}
	selected, err := listAllHalf(ctx, c, req)
	if err != nil {
		return err
	}
	verb := resolveVerb(resolution)
	if *dryRun {
		return dryRunResolve(c, selected, verb)
	}
	if len(selected) == 0 {
		return c.printFooter("0 matching; nothing to " + verb)
	}
	if resolution == txmqv1.Resolution_RESOLUTION_ROLLBACK && !*force {
		if err := confirm(c, fmt.Sprintf("%s %d half message(s)", verb, len(selected))); err != nil {
			return err
		}
	}
	ids := make([]string, len(selected))
	for i, m := range selected {
		ids[i] = m.GetMessageId()
	}
	return resolveEach(ctx, c, resolution, ids)
}

func resolveVerb(r txmqv1.Resolution) string {
	if r == txmqv1.Resolution_RESOLUTION_COMMIT {
		return "commit"
	}
	return "roll back"
}

// listAllHalf lists every half message req selects, following the pages.
func listAllHalf(ctx context.Context, c *cli, req *txmqv1.ListHalfMessagesRequest) ([]*txmqv1.HalfMessage, error) {
	var out []*txmqv1.HalfMessage
	err := listPages(0, func(size uint32, token string) ([]*txmqv1.HalfMessage, string, error) {
		page := proto.CloneOf(req)
		page.Limit, page.PageToken = size, token
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ListHalfMessages, page)
		return resp.GetMessages(), resp.GetNextPageToken(), err
	}, func(m *txmqv1.HalfMessage) error {
		out = append(out, m)
		return nil
	})
	return out, err
}

// resolveNamed resolves the messages named by MSG_IDs or by --group and
// --tx; with dryRun it shows them as they are instead.
func resolveNamed(ctx context.Context, c *cli, fs *flag.FlagSet, ids []string, filters *halfFilters, resolution txmqv1.Resolution, dryRun bool) error {
	var gets []*txmqv1.GetHalfMessageRequest
	if len(ids) > 1 && *filters.group == "" && *filters.tx == "" {
		if !dryRun {
			return resolveEach(ctx, c, resolution, ids)
		}
		for _, id := range ids {
			gets = append(gets, &txmqv1.GetHalfMessageRequest{MessageId: id})
		}
	} else {
		id, tr, err := halfTarget(c, fs, ids, *filters.group, *filters.tx)
		if err != nil {
			return err
		}
		if !dryRun {
			return resolveOne(ctx, c, &txmqv1.ResolveHalfMessageRequest{MessageId: id, Transaction: tr, Resolution: resolution})
		}
		gets = append(gets, &txmqv1.GetHalfMessageRequest{MessageId: id, Transaction: tr})
	}
	var found []*txmqv1.HalfMessage
	var failed failures
	for _, get := range gets {
		resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetHalfMessage, get)
		if err != nil {
			failed.add(c, cmp.Or(get.GetMessageId(), get.GetTransaction().GetTransactionId()), err)
			continue
		}
		found = append(found, resp.GetMessage())
	}
	if err := dryRunResolve(c, found, resolveVerb(resolution)); err != nil {
		return err
	}
	return failed.err(len(gets), "found")
}

// dryRunResolve prints the messages a resolution would be tried on, as
// half list does, and how many of them it would change: those PENDING or
// EXPIRED.
func dryRunResolve(c *cli, selected []*txmqv1.HalfMessage, verb string) error {
	err := printListing(c, halfListHeader, halfListRow,
		func(m *txmqv1.HalfMessage) any { return newHalfJSON(m) },
		func(each func(*txmqv1.HalfMessage) error) error {
			for _, m := range selected {
				if err := each(m); err != nil {
					return err
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	changing := 0
	for _, m := range selected {
		if s := m.GetState(); s == txmqv1.HalfState_HALF_STATE_PENDING || s == txmqv1.HalfState_HALF_STATE_EXPIRED {
			changing++
		}
	}
	if changing == len(selected) {
		return c.printFooter(fmt.Sprintf("dry run: would %s %d half message(s); nothing changed", verb, changing))
	}
	return c.printFooter(fmt.Sprintf("dry run: would %s %d of the %d half message(s) listed (the others are resolved already); nothing changed", verb, changing, len(selected)))
}

// resolveOne resolves one half message and prints it as it is afterwards:
// its ID and state, or with -o json every field.
func resolveOne(ctx context.Context, c *cli, req *txmqv1.ResolveHalfMessageRequest) error {
	resp, err := adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.ResolveHalfMessage, req)
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

// resolveEach resolves the messages ids one by one, each retried on its
// own (a resolution is safe to repeat). A failure is printed on stderr,
// with its ID, and the others go on; the command then fails. An interrupt
// stops it before the next one.
func resolveEach(ctx context.Context, c *cli, resolution txmqv1.Resolution, ids []string) error {
	var failed failures
	for i, id := range ids {
		if ctx.Err() != nil {
			return status.Errorf(codes.Canceled, "interrupted: %d of %d half message(s) not tried", len(ids)-i, len(ids))
		}
		if err := resolveOne(ctx, c, &txmqv1.ResolveHalfMessageRequest{MessageId: id, Resolution: resolution}); err != nil {
			failed.add(c, id, err)
		}
	}
	return failed.err(len(ids), "resolved")
}

// failures are the failed calls of a command that goes on after one
// failed, each printed on stderr with the message it was about.
type failures struct {
	first error
	n     int
}

func (f *failures) add(c *cli, name string, err error) {
	st := status.Convert(err)
	fmt.Fprintf(c.stderr, "brokerctl: %s: %s: %s\n", name, st.Code(), st.Message())
	f.first = cmp.Or(f.first, err)
	f.n++
}

// err is the command's error after total calls: nil when none failed,
// else one with the first failure's code.
func (f *failures) err(total int, what string) error {
	if f.n == 0 {
		return nil
	}
	return status.Errorf(status.Code(f.first), "%d of %d half message(s) not %s; see the errors above", f.n, total, what)
}
