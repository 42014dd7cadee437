package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Contexts are named sets of --addr, --timeout, --token and the --tls-*
// files, like nats context: one JSON file (mode 0600) per context in
// $XDG_CONFIG_HOME/txmq/context/ (or ~/.config/txmq/context/), and the name
// of the selected one in
// txmq/context.txt. A command takes each setting from the first that has
// it: the command line, the environment (TXMQ_ADDR, TXMQ_TOKEN), the context (named
// by --context, else TXMQ_CONTEXT, else the selected one), the default.

// savedContext is one context's file.
type savedContext struct {
	Addr    string `json:"addr"`
	Timeout string `json:"timeout,omitempty"`
	Token   string `json:"token,omitempty"`
	tlsFiles
}

var contextNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// contextDir is where the contexts are kept, or an error when neither
// XDG_CONFIG_HOME nor HOME is set.
func (c *cli) contextDir() (string, error) {
	base := c.env("XDG_CONFIG_HOME")
	if base == "" {
		home := c.env("HOME")
		if home == "" {
			return "", errors.New("no configuration directory for contexts: set HOME or XDG_CONFIG_HOME")
		}
		base = filepath.Join(home, ".config")
	}
	return filepath.Join(base, "txmq"), nil
}

func (c *cli) contextFile(name string) (string, error) {
	if !contextNameRE.MatchString(name) {
		return "", fmt.Errorf("context name %q: use letters, digits, '.', '_' and '-'", name)
	}
	dir, err := c.contextDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "context", name+".json"), nil
}

func (c *cli) loadContext(name string) (savedContext, error) {
	var sc savedContext
	path, err := c.contextFile(name)
	if err != nil {
		return sc, err
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return sc, fmt.Errorf("context %q does not exist; 'brokerctl context ls' lists them", name)
	}
	if err != nil {
		return sc, err
	}
	if err := json.Unmarshal(raw, &sc); err != nil {
		return sc, fmt.Errorf("context %q: %s: %w", name, path, err)
	}
	return sc, nil
}

// selectedContext is the name in context.txt, "" when none is selected.
func (c *cli) selectedContext() string {
	dir, err := c.contextDir()
	if err != nil {
		return ""
	}
	raw, err := os.ReadFile(filepath.Join(dir, "context.txt"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}

// applyContext sets --addr and --timeout where the command line did not,
// from TXMQ_ADDR and from the context.
func (c *cli) applyContext() error {
	name := c.contextName
	if !c.given["context"] {
		name = c.env("TXMQ_CONTEXT")
	}
	if name == "" {
		name = c.selectedContext()
	}
	var sc savedContext
	if name != "" {
		var err error
		if sc, err = c.loadContext(name); err != nil {
			return err
		}
	}
	if !c.given["addr"] {
		if addr := c.env("TXMQ_ADDR"); addr != "" {
			c.addr = addr
		} else if sc.Addr != "" {
			c.addr = sc.Addr
		}
	}
	if !c.given["token"] {
		if token := c.env("TXMQ_TOKEN"); token != "" {
			c.token = token
		} else {
			c.token = sc.Token
		}
	}
	c.tls.fillFrom(sc.tlsFiles, c.given)
	if !c.given["timeout"] && sc.Timeout != "" {
		d, err := time.ParseDuration(sc.Timeout)
		if err != nil {
			return fmt.Errorf("context %q: timeout %q: %w", name, sc.Timeout, err)
		}
		c.timeout = d
	}
	return nil
}

func runContextAdd(_ context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	use := fs.Bool("use", false, "select the context too, as 'context use' does")
	pos, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	if !c.given["addr"] {
		return c.usageError(fs, "--addr is required")
	}
	if _, err := parseAddrs(c.addr); err != nil {
		return c.usageError(fs, "%v", err)
	}
	files, err := c.tls.given(c.given)
	if err != nil {
		return c.usageError(fs, "%v", err)
	}
	sc := savedContext{Addr: c.addr, Token: c.token, tlsFiles: files}
	if c.given["timeout"] {
		if c.timeout <= 0 {
			return c.usageError(fs, "--timeout must be positive")
		}
		sc.Timeout = c.timeout.String()
	}
	path, err := c.contextFile(pos[0])
	if err != nil {
		return c.usageError(fs, "%v", err)
	}
	raw, err := json.MarshalIndent(sc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o600); err != nil {
		return err
	}
	if *use {
		return c.selectContext(pos[0])
	}
	_, err = fmt.Fprintf(c.stdout, "context %s saved in %s\n", pos[0], path)
	return err
}

func runContextUse(_ context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	if _, err := c.loadContext(pos[0]); err != nil {
		return c.usageError(fs, "%v", err)
	}
	return c.selectContext(pos[0])
}

// selectContext writes context.txt.
func (c *cli) selectContext(name string) error {
	dir, err := c.contextDir()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "context.txt"), []byte(name+"\n"), 0o600); err != nil {
		return err
	}
	_, err = fmt.Fprintf(c.stdout, "using context %s\n", name)
	return err
}

type contextJSON struct {
	Name     string `json:"context"`
	Addr     string `json:"addr"`
	Timeout  string `json:"timeout,omitempty"`
	Selected bool   `json:"selected"`
}

func runContextList(_ context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	if _, err := c.parse(fs, args); err != nil {
		return err
	}
	dir, err := c.contextDir()
	if err != nil {
		return err
	}
	files, err := filepath.Glob(filepath.Join(dir, "context", "*.json"))
	if err != nil {
		return err
	}
	sort.Strings(files)
	selected := c.selectedContext()
	return printListing(c, "CONTEXT\tADDR\tTIMEOUT\tSELECTED",
		func(cj contextJSON) string {
			mark := ""
			if cj.Selected {
				mark = "*"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s", cj.Name, cj.Addr, orDash(cj.Timeout), mark)
		},
		func(cj contextJSON) any { return cj },
		func(each func(contextJSON) error) error {
			for _, f := range files {
				name := strings.TrimSuffix(filepath.Base(f), ".json")
				sc, err := c.loadContext(name)
				if err != nil {
					return err
				}
				if err := each(contextJSON{Name: name, Addr: sc.Addr, Timeout: sc.Timeout, Selected: name == selected}); err != nil {
					return err
				}
			}
			return nil
		})
}

func runContextRemove(_ context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	pos, err := c.parse(fs, args, "NAME")
	if err != nil {
		return err
	}
	path, err := c.contextFile(pos[0])
	if err != nil {
		return c.usageError(fs, "%v", err)
	}
	if err := os.Remove(path); errors.Is(err, os.ErrNotExist) {
		return c.usageError(fs, "context %q does not exist", pos[0])
	} else if err != nil {
		return err
	}
	if c.selectedContext() == pos[0] {
		dir, _ := c.contextDir()
		if err := os.Remove(filepath.Join(dir, "context.txt")); err != nil {
			return err
		}
	}
	_, err = fmt.Fprintf(c.stdout, "context %s removed\n", pos[0])
	return err
}
