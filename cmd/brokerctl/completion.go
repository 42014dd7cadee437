package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Shell completion, generated from the command table and each command's
// own flags: "brokerctl completion bash|zsh|fish" prints a script to
// source. It is a built-in like help, outside the table it reads.

// builtins are the commands run handles itself, for the usage text.
var builtins = [][2]string{
	{"help [COMMAND]", "the commands, or a command's arguments and flags"},
	{"completion bash|zsh|fish", "print a shell completion script: source <(brokerctl completion bash)"},
}

// completionEntry is a command's words and flags.
type completionEntry struct {
	words []string
	flags []string
}

// completionEntries lists every command with its flags, found by running
// it with -h on a cli that prints nothing: a command defines its flags
// before it does anything else.
func completionEntries(ctx context.Context) []completionEntry {
	var out []completionEntry
	for _, cmd := range commands {
		probe := &cli{given: map[string]bool{}, env: func(string) string { return "" },
			stdout: io.Discard, stderr: io.Discard, helpOut: io.Discard, cmd: cmd}
		fs := probe.flagSet(cmd)
		_ = cmd.run(ctx, probe, fs, []string{"-h"})
		var flags []string
		fs.VisitAll(func(f *flag.Flag) { flags = append(flags, "--"+f.Name) })
		out = append(out, completionEntry{words: strings.Fields(cmd.name), flags: flags})
	}
	return append(out,
		completionEntry{words: []string{"help"}},
		completionEntry{words: []string{"completion"}})
}

// runCompletion prints the completion script for a shell.
func (c *cli) runCompletion(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return c.globalUsageError("completion: want one argument, bash, zsh or fish")
	}
	entries := completionEntries(ctx)
	switch args[0] {
	case "bash":
		_, err := io.WriteString(c.stdout, bashCompletion(entries))
		return err
	case "zsh":
		// zsh runs the bash function through its bashcompinit.
		_, err := io.WriteString(c.stdout, "autoload -U +X bashcompinit && bashcompinit\n"+bashCompletion(entries))
		return err
	case "fish":
		_, err := io.WriteString(c.stdout, fishCompletion(entries))
		return err
	}
	return c.globalUsageError("completion: unknown shell %q; use bash, zsh or fish", args[0])
}

// globalFlagsTakingValues are skipped with their value when the script
// looks for the command words.
const globalFlagsTakingValues = "--addr|-addr|--timeout|-timeout|--context|-context|-o|--o"

// nextWords maps each prefix of command words ("" for none) to the words
// that may follow it.
func nextWords(entries []completionEntry) map[string][]string {
	next := map[string][]string{}
	for _, e := range entries {
		for i := range e.words {
			prefix := strings.Join(e.words[:i], " ")
			if !containsWord(next[prefix], e.words[i]) {
				next[prefix] = append(next[prefix], e.words[i])
			}
		}
	}
	return next
}

func containsWord(list []string, w string) bool {
	for _, x := range list {
		if x == w {
			return true
		}
	}
	return false
}

func bashCompletion(entries []completionEntry) string {
	var b strings.Builder
	b.WriteString(`# brokerctl completion for bash, from "brokerctl completion bash".
_brokerctl() {
    local cur=${COMP_WORDS[COMP_CWORD]} words="" w i
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
        ` + globalFlagsTakingValues + `) ((i++)) ;;
        -*) ;;
        *) words="${words:+$words }$w" ;;
        esac
    done
    case "$words" in
`)
	next := nextWords(entries)
	prefixes := make([]string, 0, len(next))
	for p := range next {
		prefixes = append(prefixes, p)
	}
	sort.Strings(prefixes)
	for _, p := range prefixes {
		fmt.Fprintf(&b, "    %q) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", p, strings.Join(next[p], " "))
	}
	for _, e := range entries {
		if len(e.flags) > 0 {
			fmt.Fprintf(&b, "    %q*) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", strings.Join(e.words, " ")+" ", strings.Join(e.flags, " "))
			fmt.Fprintf(&b, "    %q) COMPREPLY=($(compgen -W %q -- \"$cur\")) ;;\n", strings.Join(e.words, " "), strings.Join(e.flags, " "))
		}
	}
	b.WriteString("    esac\n}\ncomplete -F _brokerctl brokerctl\n")
	return b.String()
}

func fishCompletion(entries []completionEntry) string {
	var b strings.Builder
	b.WriteString("# brokerctl completion for fish, from \"brokerctl completion fish\".\ncomplete -c brokerctl -f\n")
	next := nextWords(entries)
	fmt.Fprintf(&b, "complete -c brokerctl -n __fish_use_subcommand -a %q\n", strings.Join(next[""], " "))
	for _, e := range entries {
		if len(e.words) == 2 {
			fmt.Fprintf(&b, "complete -c brokerctl -n '__fish_seen_subcommand_from %s; and not __fish_seen_subcommand_from %s' -a %q\n",
				e.words[0], strings.Join(next[e.words[0]], " "), e.words[1])
		}
		cond := "__fish_seen_subcommand_from " + e.words[0]
		if len(e.words) == 2 {
			cond += "; and __fish_seen_subcommand_from " + e.words[1]
		}
		for _, f := range e.flags {
			fmt.Fprintf(&b, "complete -c brokerctl -n '%s' -l %s\n", cond, strings.TrimPrefix(f, "--"))
		}
	}
	return b.String()
}
