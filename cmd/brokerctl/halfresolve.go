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
	dryRun := fs.Bool("dry-run", false, "with --all: list the messages it would resolve, and change nothing")
	force := forceFlag(fs)
	pos, err := c.start(fs, args, "[MSG_ID...]")
	if err != nil {
		return err
	}
	if !*all {
		for _, name := range []string{"state", "topic", "older-than", "dry-run"} {
			if flagGiven(fs, name) {
				return c.usageError(fs, "--%s goes with --all", name)
			}
		}
		if len(pos) > 1 && *filters.group == "" && *filters.tx == "" {
			return resolveEach(ctx, c, resolution, pos)
		}
		id, tr, err := halfTarget(c, fs, pos, *filters.group, *filters.tx)
		if err != nil {
			return err
		}
		return resolveOne(ctx, c, &txmqv1.ResolveHalfMessageRequest{MessageId: id, Transaction: tr, Resolution: resolution})
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

// dryRunResolve prints the messages a resolution would change, as half
// list does, and how many.
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
	return c.printFooter(fmt.Sprintf("dry run: would %s %d half message(s); nothing changed", verb, len(selected)))
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
	var first error
	failed := 0
	for i, id := range ids {
		if ctx.Err() != nil {
			return status.Errorf(codes.Canceled, "interrupted: %d of %d half message(s) not tried", len(ids)-i, len(ids))
		}
		err := resolveOne(ctx, c, &txmqv1.ResolveHalfMessageRequest{MessageId: id, Resolution: resolution})
		if err != nil {
			st := status.Convert(err)
			fmt.Fprintf(c.stderr, "brokerctl: %s: %s: %s\n", id, st.Code(), st.Message())
			first = cmp.Or(first, err)
			failed++
		}
	}
	if failed == 0 {
		return nil
	}
	return status.Errorf(status.Code(first), "%d of %d half message(s) not resolved; see the errors above", failed, len(ids))
}
