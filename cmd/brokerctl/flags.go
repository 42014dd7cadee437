package main

import (
	"errors"
	"flag"
	"strings"
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
