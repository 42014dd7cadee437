package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// reorder moves the flags in args in front of the positional arguments, so
// that flags may follow them, as in "half send orders BODY --group shop".
// Everything after "--" stays positional.
func reorder(fs *flag.FlagSet, args []string) []string {
	var flags, positionals []string
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			positionals = append(positionals, args[i+1:]...)
			break
		}
		if len(arg) < 2 || arg[0] != '-' {
			positionals = append(positionals, arg)
			continue
		}
		flags = append(flags, arg)
		if !strings.Contains(arg, "=") && takesValue(fs, arg) {
			if i+1 == len(args) {
				// Nothing follows for its value: without a "--" after it,
				// fs.Parse reports the flag's missing argument instead of
				// taking "--" for its value.
				return flags
			}
			i++
			flags = append(flags, args[i])
		}
	}
	return append(append(flags, "--"), positionals...)
}

// takesValue reports whether arg names a flag of fs that takes a value as
// the next argument. Unknown flags are left for fs.Parse to report.
func takesValue(fs *flag.FlagSet, arg string) bool {
	f := fs.Lookup(strings.TrimLeft(arg, "-"))
	if f == nil {
		return false
	}
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// enumKey is how a flag's enum value is looked up: case-insensitively,
// with "_" the same as "-", so that the spelling brokerctl prints
// (ROLLED_BACK, from the API's enum) is also accepted (rolled-back).
func enumKey(s string) string {
	return strings.ReplaceAll(strings.ToLower(s), "_", "-")
}

// flagGiven reports whether the flag name was set on the command line, as
// opposed to keeping its default.
func flagGiven(fs *flag.FlagSet, name string) bool {
	given := false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == name })
	return given
}

// propertiesFlag collects repeated --prop key=value flags.
type propertiesFlag map[string]string

func (p propertiesFlag) String() string {
	pairs := make([]string, 0, len(p))
	for _, k := range sortedKeys(p) {
		pairs = append(pairs, k+"="+p[k])
	}
	return strings.Join(pairs, ",")
}

func (p propertiesFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return errors.New("want key=value")
	}
	p[k] = v
	return nil
}

// startFlag is a position in a topic: earliest, latest, or a time, given
// as RFC 3339 or as a negative duration back from now, such as -1h.
type startFlag struct {
	text     string
	position txmqv1.StartPosition
	// time is set with START_POSITION_TIMESTAMP.
	time *timestamppb.Timestamp
}

func (s *startFlag) String() string { return s.text }

func (s *startFlag) Set(v string) error {
	switch enumKey(v) {
	case "earliest":
		*s = startFlag{text: v, position: txmqv1.StartPosition_START_POSITION_EARLIEST}
		return nil
	case "latest":
		*s = startFlag{text: v, position: txmqv1.StartPosition_START_POSITION_LATEST}
		return nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		d, derr := time.ParseDuration(v)
		if derr != nil || d >= 0 {
			return errors.New("want earliest, latest, an RFC 3339 time such as 2026-05-01T10:00:00Z, or a negative duration such as -1h")
		}
		t = time.Now().Add(d)
	}
	*s = startFlag{text: v, position: txmqv1.StartPosition_START_POSITION_TIMESTAMP, time: timestamppb.New(t)}
	return nil
}

// durationsFlag is a comma-separated list of durations, such as 1s,5s,30s.
type durationsFlag []time.Duration

func (d *durationsFlag) String() string {
	if d == nil {
		return ""
	}
	return joinDurations(*d)
}

func (d *durationsFlag) Set(s string) error {
	var list []time.Duration
	for part := range strings.SplitSeq(s, ",") {
		v, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil {
			return fmt.Errorf("want durations separated by commas, such as 1s,5s,30s: %q is not a duration", part)
		}
		list = append(list, v)
	}
	*d = list
	return nil
}

// joinDurations renders durations the way durationsFlag reads them.
func joinDurations(list []time.Duration) string {
	parts := make([]string, len(list))
	for i, v := range list {
		parts[i] = v.String()
	}
	return strings.Join(parts, ",")
}
