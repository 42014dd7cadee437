package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"strings"

	"golang.org/x/crypto/bcrypt"
)

// runAuthHash prints the token_hash of a token for the auth file
// (docs/security.md). It does not call the broker.
func runAuthHash(_ context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.parse(fs, args, "[TOKEN|-]")
	if err != nil {
		return err
	}
	token, made := "", false
	switch {
	case len(pos) == 0:
		token, made = "txmq_"+rand.Text(), true
	case pos[0] == "-":
		line, err := bufio.NewReader(c.stdin).ReadString('\n')
		token = strings.TrimRight(line, "\r\n")
		if token == "" {
			return fmt.Errorf("reading the token from stdin: %w", err)
		}
	default:
		token = pos[0]
	}
	// bcrypt takes at most 72 bytes: a longer token would match on its
	// first 72 only.
	if len(token) > 72 {
		return c.usageError(fs, "the token is %d bytes; bcrypt takes at most 72", len(token))
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(token), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	if made {
		fmt.Fprintf(c.stdout, "token:      %s\n", token)
	}
	_, err = fmt.Fprintf(c.stdout, "token_hash: %q\n", hash)
	return err
}
