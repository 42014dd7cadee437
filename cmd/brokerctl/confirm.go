package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/term"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Destructive commands ask before they act, as the nats CLI does: on a
// terminal they ask for a yes; without one they refuse, unless -f/--force.

// terminalInput is standard input when it is a terminal, nil otherwise.
// Tests replace it.
var terminalInput = func() io.Reader {
	if term.IsTerminal(int(os.Stdin.Fd())) {
		return os.Stdin
	}
	return nil
}

// forceFlag registers -f and --force, which skip the confirmation.
func forceFlag(fs *flag.FlagSet) *bool {
	force := fs.Bool("force", false, "do it without asking for confirmation")
	fs.BoolVar(force, "f", false, "the same as --force")
	return force
}

// confirm asks on the terminal whether to go ahead and do what, such as
// "roll back 3 half message(s)". Without a terminal, or without a yes, it
// returns an error and the command changes nothing.
func confirm(c *cli, what string) error {
	in := terminalInput()
	if in == nil {
		fmt.Fprintf(c.stderr, "brokerctl: refusing to %s without confirmation: no terminal to ask on; give -f (--force) to go ahead\n", what)
		return errUsage
	}
	fmt.Fprintf(c.stderr, "%s? [y/N] ", what)
	answer, err := bufio.NewReader(in).ReadString('\n')
	if err != nil && answer == "" {
		return status.Errorf(codes.Aborted, "not confirmed (%v); nothing changed", err)
	}
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return nil
	}
	return status.Error(codes.Aborted, "not confirmed; nothing changed")
}
