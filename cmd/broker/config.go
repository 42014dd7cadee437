package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Every flag can also be set by a TXMQ_* variable (--raft-listen is
// TXMQ_RAFT_LISTEN) and in the YAML file of --config, whose keys are the
// flag names. The first of these that sets a flag wins: the command line,
// the variable, the file, the flag's default. Values go through the
// flag's own parsing, so the file and the variables are checked against
// the same bounds as the command line.

// configFlag names the file; it and --version exist only on the command
// line (and TXMQ_CONFIG for the file).
const configFlag = "config"

var commandLineOnly = map[string]bool{configFlag: true, "version": true}

// envName is the variable that sets a flag.
func envName(flagName string) string {
	return "TXMQ_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applySources sets the flags the command line left alone from the
// variables env looks up and from the --config file.
func applySources(fs *flag.FlagSet, env func(string) (string, bool)) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	path := fs.Lookup(configFlag).Value.String()
	if p, ok := env(envName(configFlag)); ok && !given[configFlag] {
		path = p
	}
	if path != "" {
		settings, err := readConfigFile(path, fs)
		if err != nil {
			return err
		}
		for _, s := range settings {
			if _, inEnv := env(envName(s.name)); given[s.name] || inEnv {
				continue
			}
			if err := fs.Set(s.name, s.value); err != nil {
				return fmt.Errorf("%s:%d: %s: %w", path, s.line, s.name, err)
			}
		}
	}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		v, ok := env(envName(f.Name))
		if !ok || err != nil || given[f.Name] || commandLineOnly[f.Name] {
			return
		}
		if serr := fs.Set(f.Name, v); serr != nil {
			err = fmt.Errorf("%s: %w", envName(f.Name), serr)
		}
	})
	return err
}

// setting is one key of the config file.
type setting struct {
	name, value string
	line        int
}

// readConfigFile reads a YAML mapping of flag names to values: scalars,
// or lists for the comma-separated flags. A key that is no flag is an
// error naming it and its line.
func readConfigFile(path string, fs *flag.FlagSet) ([]setting, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: want a mapping of flag names to values, such as \"listen: 127.0.0.1:7420\"", path, root.Line)
	}
	var out []setting
	seen := map[string]int{}
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		switch first, dup := seen[k.Value]; {
		case fs.Lookup(k.Value) == nil || commandLineOnly[k.Value]:
			return nil, fmt.Errorf("%s:%d: unknown key %q: the keys are the broker's flag names without dashes in front, such as raft-listen", path, k.Line, k.Value)
		case dup:
			return nil, fmt.Errorf("%s:%d: key %q again (first on line %d)", path, k.Line, k.Value, first)
		}
		seen[k.Value] = k.Line
		value, err := yamlValue(v)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %s: %w", path, v.Line, k.Value, err)
		}
		out = append(out, setting{name: k.Value, value: value, line: k.Line})
	}
	return out, nil
}

// yamlValue is a scalar as the command line would spell it, a list joined
// with commas, and null as empty.
func yamlValue(n *yaml.Node) (string, error) {
	switch {
	case n.Kind == yaml.ScalarNode && n.Tag == "!!null":
		return "", nil
	case n.Kind == yaml.ScalarNode:
		return n.Value, nil
	case n.Kind == yaml.SequenceNode:
		parts := make([]string, len(n.Content))
		for i, item := range n.Content {
			if item.Kind != yaml.ScalarNode {
				return "", errors.New("want a list of plain values")
			}
			parts[i] = item.Value
		}
		return strings.Join(parts, ","), nil
	}
	return "", errors.New("want a value or a list of values")
}
