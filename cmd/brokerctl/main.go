// Command brokerctl is the operator's command line for a txmq broker. It sends
// plain and half messages; lists (by filters), shows, checks back and
// resolves half messages, one, several or every one a filter selects;
// consumes topics, acking or nacking, or peeks at them without a group;
// reads committed messages by sequence, ID or key; lists producer instances;
// shows or changes a group's check-back and delivery policies; shows topics,
// consumer groups and the Raft cluster; resets consumer groups; lists,
// redrives and purges dead letters; changes the cluster's membership and
// leadership; and sums up rates, backlogs and the leader (stats), all
// through the public gRPC API (api/proto/txmq/v1). Given the addresses of
// several nodes, it finds the leader and rides out elections with the Go
// client's connection, txmq.Conn (nodes.go).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/buildinfo"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2

	defaultAddr    = "127.0.0.1:7420"
	defaultTimeout = 10 * time.Second
)

// errUsage reports a usage error whose message and usage text are already
// printed.
var errUsage = errors.New("usage error")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one stops the process the default way.
	context.AfterFunc(ctx, stop)
	code := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one brokerctl subcommand, such as "half send".
type command struct {
	name    string
	args    string
	summary string
	run     func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error
}

var commands = []command{
	{"send", "TOPIC BODY|- [--key K] [--ordering-key K] [--prop k=v]...", "send a plain message, its body read from stdin when BODY is -; prints its ID", runSend},
	{"half send", "TOPIC BODY|- --group G --tx TXID [--key K] [--ordering-key K] [--prop k=v]... [--check-after D]", "store a half message, invisible to consumers until committed, its body read from stdin when BODY is -; prints its ID", runHalfSend},
	{"half list", "[--group G] [--state pending|committed|rolled-back|expired|all] [--tx TXID] [--topic T] [--older-than D] [--limit N] [--after TOKEN] [--watch [--interval D]]", "list half messages (default: pending ones), oldest first, and how many match", runHalfList},
	{"half show", "MSG_ID | --group G --tx TXID", "show every field of a half message", runHalfShow},
	{"half check", "MSG_ID", "check back a pending or expired half message now: ask its producer group and apply the answer", runHalfCheck},
	{"half commit", "MSG_ID... | --group G --tx TXID | --all [filters of half list]; [--dry-run]", "commit half messages as an operator; works on EXPIRED messages too", runHalfCommit},
	{"half rollback", "MSG_ID... | --group G --tx TXID | --all [filters of half list]; [--dry-run] [-f]", "roll back half messages as an operator; works on EXPIRED messages too", runHalfRollback},
	{"msg get", "TOPIC SEQ | --id ID [TOPIC]", "show a committed message, without a consumer group and without acking", runMsgGet},
	{"msg find", "--key K [--topic T] [--limit N]", "list the committed messages with a key (a scan of the retained logs)", runMsgFind},
	{"consume", "TOPIC --group G [--count N] [--wait D] [--start earliest|latest|TIME] [--nack [--nack-delay D] | --term] | TOPIC --peek [--start ...] [--count N] [--wait D]", "print committed messages and ack (or, with --nack, nack; with --term, dead-letter) each after printing it; with --peek, print without a group and without acking", runConsume},
	{"topic create", "NAME", "create a topic; succeeds if it exists already", runTopicCreate},
	{"topic list", "", "list topics: retained sequences, messages and bytes, consumer groups", runTopicList},
	{"topic delete", "NAME [--dry-run] [-f]", "delete a topic with its messages, consumer groups and their dead letters; shows what it drops and asks first", runTopicDelete},
	{"producer list", "[--group G]", "list the producer instances registered on the leader", runProducerList},
	{"group list", "[--topic T] [--unused]", "show every consumer group's progress, one line per group and topic", runGroupList},
	{"group describe", "GROUP [--members] [--watch [--interval D]]", "show a consumer group's delivery policy and its progress on each of its topics (and its subscribers)", runGroupDescribe},
	{"group create", "GROUP --topic T [--start earliest|latest|TIME]", "create a consumer group on a topic; succeeds if it exists already", runGroupCreate},
	{"group delete", "GROUP [--topic T] [--dry-run] [-f]", "delete a consumer group's progress and dead letters (on every topic, with its delivery policy, unless --topic); shows what it drops and asks first", runGroupDelete},
	{"group config", "GROUP [--max-deliveries N] [--ack-deadline D] [--redelivery-backoff D,D,...] [--ordered-poison skip|hold] [--max-checks N] [--check-backoff D] [--max-check-backoff D] [--max-half-age D] [--expiry park|rollback] [--callback URL]", "show a group's delivery policy (consumer group) and check-back policy (producer group), or change the given settings", runGroupConfig},
	{"group reset", "GROUP --to earliest|latest|TIME [--topic T] [--dry-run] [-f]", "move a consumer group's position; its subscribers are disconnected and resubscribe there", runGroupReset},
	{"dlq list", "GROUP [--topic T] [--limit N]", "list a consumer group's dead letters", runDLQList},
	{"dlq show", "GROUP MSG_ID", "show every field of a dead letter, with its body", runDLQShow},
	{"dlq redrive", "GROUP MSG_ID...|--all [--topic T]", "give dead letters back to their group, with their attempts reset; prints how many", runDLQRedrive},
	{"dlq purge", "GROUP MSG_ID...|--all [--topic T] [--dry-run] [-f]", "delete dead letters for good; lists them and asks first; prints how many", runDLQPurge},
	{"cluster status", "", "show the Raft cluster as the first node of --addr that answers sees it", runClusterStatus},
	{"cluster join", "NODE_ID RAFT_ADDR [--grpc GRPC_ADDR]", "add a node to the cluster as a voter; succeeds if it is a member already", runClusterJoin},
	{"cluster remove", "NODE_ID [-f]", "remove a node from the cluster; asks first", runClusterRemove},
	{"cluster transfer-leader", "[NODE_ID]", "hand leadership to a node, or to the most up-to-date follower; prints the new leader", runClusterTransferLeader},
	{"cluster snapshot", "", "snapshot the state of the first node of --addr and truncate its log; prints the index it covers", runClusterSnapshot},
	{"context add", "NAME --addr ADDRS [--timeout D] [--token T] [--use]", "save --addr, --timeout and --token as a named context, like nats context", runContextAdd},
	{"context use", "NAME", "select the context that commands use when neither --context nor TXMQ_CONTEXT names one", runContextUse},
	{"context ls", "", "list the saved contexts; * marks the selected one", runContextList},
	{"context rm", "NAME", "delete a saved context", runContextRemove},
	{"auth hash", "[TOKEN|-]", "print the bcrypt hash of a token (read from stdin with -) for a principal's token_hash in the auth file; with no TOKEN, make a new random one and print it too", runAuthHash},
	{"stats", "[--interval D] [--watch]", "a one-screen summary from the leader: commit, check-back and delivery rates over --interval, pending half messages, lag, dead letters", runStats},
}

// cli holds the global flags, the output streams and, once a command's
// arguments are parsed, the broker's addresses and the connection to its
// nodes.
type cli struct {
	addr    string
	output  string
	timeout time.Duration
	// contextName is --context: the saved context to take --addr and
	// --timeout from (contexts.go).
	contextName string
	// token is --token: the principal's bearer token.
	token string
	// tls are --tls-ca, --tls-cert and --tls-key (tls.go).
	tls tlsFiles
	// given are the global flags set on the command line, before or after
	// the command: they win over the environment and the context.
	given  map[string]bool
	env    func(string) string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	// cmd is the command being run; helpOut is where its -h goes (stdout
	// for "brokerctl help CMD").
	cmd     command
	helpOut io.Writer
	// addrs is --addr split into its addresses.
	addrs []string
	// conn is the Go client's connection to the nodes of addrs, and to the
	// leaders their NotLeader answers name; nil until start.
	conn *txmq.Conn
}

// run is brokerctl without the process around it: it returns the exit code.
func run(ctx context.Context, args []string, env func(string) string, stdin io.Reader, stdout, stderr io.Writer) int {
	c := &cli{addr: defaultAddr, output: "table", timeout: defaultTimeout, given: map[string]bool{}, env: env,
		stdin: stdin, stdout: stdout, stderr: stderr, helpOut: stderr}
	global := flag.NewFlagSet("brokerctl", flag.ContinueOnError)
	// Parse errors are printed as usage errors, below.
	global.SetOutput(io.Discard)
	c.globalFlags(global)
	version := global.Bool("version", false, "print the version and exit")
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(stderr)
			return exitOK
		}
		return c.exitCode(c.globalUsageError("%v", err))
	}
	global.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	if *version {
		fmt.Fprintln(stdout, buildinfo.Get().Line("brokerctl"))
		return exitOK
	}
	rest := global.Args()
	if len(rest) > 0 && rest[0] == "help" {
		return c.exitCode(c.help(ctx, rest[1:]))
	}
	if len(rest) > 0 && rest[0] == "completion" {
		return c.exitCode(c.runCompletion(ctx, rest[1:]))
	}
	cmd, cmdArgs, err := lookup(rest)
	if err != nil {
		return c.exitCode(c.globalUsageError("%v", err))
	}
	c.cmd = cmd
	err = cmd.run(ctx, c, c.flagSet(cmd), cmdArgs)
	if c.conn != nil {
		c.conn.Close()
	}
	return c.exitCode(err)
}

// lookup finds the command named by the first one or two words of args and
// returns it with the arguments that follow its name.
func lookup(args []string) (command, []string, error) {
	if len(args) == 0 {
		return command{}, nil, errors.New("missing command")
	}
	if len(args) > 1 {
		for _, cmd := range commands {
			if cmd.name == args[0]+" "+args[1] {
				return cmd, args[2:], nil
			}
		}
	}
	isGroup := false
	for _, cmd := range commands {
		if cmd.name == args[0] {
			return cmd, args[1:], nil
		}
		isGroup = isGroup || strings.HasPrefix(cmd.name, args[0]+" ")
	}
	switch {
	case isGroup && len(args) == 1:
		return command{}, nil, fmt.Errorf("%q needs a subcommand", args[0])
	case isGroup:
		return command{}, nil, fmt.Errorf("unknown command %q", args[0]+" "+args[1])
	default:
		return command{}, nil, fmt.Errorf("unknown command %q", args[0])
	}
}

func (c *cli) globalFlags(fs *flag.FlagSet) {
	// The current values are the defaults, so that registering the global
	// flags again on a subcommand keeps what was parsed before it.
	fs.StringVar(&c.addr, "addr", c.addr, "broker gRPC `addresses`, comma-separated: calls go to the first that answers, and writes follow the leader (env TXMQ_ADDR)")
	fs.StringVar(&c.output, "o", c.output, "output `format`: table or json")
	fs.DurationVar(&c.timeout, "timeout", c.timeout, "bound on each wait for the broker, the tries of several nodes included")
	fs.StringVar(&c.token, "token", c.token, "bearer `token` of your principal, for a broker with an auth file (env TXMQ_TOKEN; sent without TLS to loopback addresses only)")
	fs.StringVar(&c.tls.CA, "tls-ca", c.tls.CA, "connect over TLS, verifying the brokers against the CA certificates in `FILE` (PEM)")
	fs.StringVar(&c.tls.Cert, "tls-cert", c.tls.Cert, "connect over TLS with the client certificate in `FILE` (PEM), for brokers that ask for one")
	fs.StringVar(&c.tls.Key, "tls-key", c.tls.Key, "the private key of --tls-cert, in `FILE` (PEM)")
	fs.StringVar(&c.contextName, "context", c.contextName, "take --addr and --timeout from the saved context `NAME` (env TXMQ_CONTEXT; default: the one of 'brokerctl context use')")
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprintf(w, "usage: brokerctl [global flags] COMMAND [arguments and flags]\n\ncommands:\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
	}
	for _, b := range builtins {
		fmt.Fprintf(tw, "  %s\t%s\n", b[0], b[1])
	}
	tw.Flush()
	fmt.Fprintf(w, "\nglobal flags (also accepted after the command):\n")
	fs := flag.NewFlagSet("brokerctl", flag.ContinueOnError)
	fs.SetOutput(w)
	c.globalFlags(fs)
	fs.PrintDefaults()
	fmt.Fprintf(w, "  --version\n    \tprint the version and exit (before the command only)\n")
	fmt.Fprintf(w, "\nRun \"brokerctl help COMMAND\" (or \"brokerctl COMMAND -h\") for a command's arguments and flags.\n")
}

// flagSet returns the flag set of a command, with the global flags on it.
// Parse errors are printed as usage errors, -h by commandHelp (parse).
func (c *cli) flagSet(cmd command) *flag.FlagSet {
	fs := flag.NewFlagSet("brokerctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	c.globalFlags(fs)
	return fs
}

// commandHelp prints the command's arguments, summary and every flag.
func (c *cli) commandHelp(fs *flag.FlagSet) {
	fmt.Fprintf(c.helpOut, "usage: %s\n\n%s.\nFlags may come before or after the arguments; use -- before an argument that starts with -.\n\nflags:\n",
		strings.TrimSpace(fs.Name()+" "+c.cmd.args), c.cmd.summary)
	fs.SetOutput(c.helpOut)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// help is "brokerctl help [COMMAND]": the commands, or one command's
// arguments and flags, on stdout.
func (c *cli) help(ctx context.Context, words []string) error {
	if len(words) == 0 {
		c.usage(c.stdout)
		return nil
	}
	for _, b := range builtins {
		if strings.Fields(b[0])[0] == words[0] && len(words) == 1 {
			_, err := fmt.Fprintf(c.stdout, "usage: brokerctl %s\n\n%s.\n", b[0], b[1])
			return err
		}
	}
	cmd, rest, err := lookup(words)
	if err != nil {
		return c.globalUsageError("help: %v", err)
	}
	if len(rest) > 0 {
		return c.globalUsageError("help: unexpected argument %q", rest[0])
	}
	c.cmd, c.helpOut = cmd, c.stdout
	// The command's flags are defined where it runs: -h prints them before
	// it does anything else.
	return cmd.run(ctx, c, c.flagSet(cmd), []string{"-h"})
}

// start parses a command's arguments (parse), takes the global flags the
// command line left alone from the environment and the context, checks
// them, and prepares the connections to the broker. It returns the
// positional arguments.
func (c *cli) start(fs *flag.FlagSet, args []string, positionals ...string) ([]string, error) {
	got, err := c.parse(fs, args, positionals...)
	if err != nil {
		return nil, err
	}
	if err := c.applyContext(); err != nil {
		return nil, c.usageError(fs, "%v", err)
	}
	if c.timeout <= 0 {
		return nil, c.usageError(fs, "--timeout must be positive")
	}
	addrs, err := parseAddrs(c.addr)
	if err != nil {
		return nil, c.usageError(fs, "%v", err)
	}
	c.addrs = addrs
	if err := c.dial(); err != nil {
		return nil, c.usageError(fs, "%v", err)
	}
	return got, nil
}

// parse parses a command's arguments and checks that the named positional
// arguments are there and that -o is valid, without the broker: commands
// that do not call it (context, completion) use it alone. Positionals in
// brackets, such as "[NODE_ID]", are optional and come last; a last one
// such as "[MSG_ID...]" takes any number of arguments.
func (c *cli) parse(fs *flag.FlagSet, args []string, positionals ...string) ([]string, error) {
	if err := fs.Parse(reorder(fs, args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.commandHelp(fs)
			return nil, err
		}
		return nil, c.usageError(fs, "%v", err)
	}
	fs.Visit(func(f *flag.Flag) { c.given[f.Name] = true })
	got := fs.Args()
	required := 0
	for _, p := range positionals {
		if !strings.HasPrefix(p, "[") {
			required++
		}
	}
	variadic := len(positionals) > 0 && strings.HasSuffix(positionals[len(positionals)-1], "...]")
	switch {
	case len(got) > 0 && len(positionals) == 0:
		return nil, c.usageError(fs, "unexpected argument %q", got[0])
	case variadic:
		if len(got) < required {
			return nil, c.usageError(fs, "want at least %d argument(s), %s; got %d", required, strings.Join(positionals, " "), len(got))
		}
	case required == len(positionals) && len(got) != required:
		return nil, c.usageError(fs, "want %d argument(s), %s; got %d", len(positionals), strings.Join(positionals, " "), len(got))
	case len(got) < required || len(got) > len(positionals):
		return nil, c.usageError(fs, "want %d to %d argument(s), %s; got %d", required, len(positionals), strings.Join(positionals, " "), len(got))
	case c.output != "table" && c.output != "json":
		return nil, c.usageError(fs, "-o must be table or json, not %q", c.output)
	}
	return got, nil
}

// usageError prints a usage problem on one line, and on a second the
// command's synopsis and where its flags are described: not every flag.
func (c *cli) usageError(fs *flag.FlagSet, format string, args ...any) error {
	fmt.Fprintf(c.stderr, "%s: %s\n", fs.Name(), fmt.Sprintf(format, args...))
	fmt.Fprintf(c.stderr, "usage: %s; run 'brokerctl help %s' for its flags\n",
		strings.TrimSpace(fs.Name()+" "+c.cmd.args), c.cmd.name)
	return errUsage
}

// globalUsageError is usageError before a command is known.
func (c *cli) globalUsageError(format string, args ...any) error {
	fmt.Fprintf(c.stderr, "brokerctl: %s\n", fmt.Sprintf(format, args...))
	fmt.Fprintf(c.stderr, "usage: brokerctl [global flags] COMMAND [arguments and flags]; run 'brokerctl help' for the commands\n")
	return errUsage
}

// exitCode reports err, unless it was reported already, and returns the exit
// code for it. Failures print the gRPC status as "brokerctl: CODE: message",
// saying when the retries ran out at --timeout, and with the leader's
// address when the broker answered that it is not the leader.
func (c *cli) exitCode(err error) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errUsage):
		return exitUsage
	}
	st := status.Convert(err)
	msg := st.Message()
	// The client keeps the last Unavailable of the retries that --timeout
	// ended, and matches the deadline too.
	if st.Code() == codes.Unavailable && errors.Is(err, context.DeadlineExceeded) {
		msg += fmt.Sprintf(" (gave up after retrying for --timeout %s)", c.timeout)
	}
	for _, detail := range st.Details() {
		if nl, ok := detail.(*txmqv1.NotLeader); ok && nl.GetLeaderAddress() != "" {
			msg += " (retry with --addr " + nl.GetLeaderAddress() + ")"
		}
	}
	fmt.Fprintf(c.stderr, "brokerctl: %s: %s\n", st.Code(), msg)
	return exitFailure
}
