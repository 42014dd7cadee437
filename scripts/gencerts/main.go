// Command gencerts writes throwaway certificates for a local cluster: a
// CA (ca.pem) and, for each name given, NAME.pem and NAME-key.pem, valid
// for 127.0.0.1 and localhost and for both ends of a connection.
// scripts/cluster.sh --tls runs it. The CA's key is not kept: the
// certificates cannot be added to, only made again. Never for production
// (docs/security.md).
//
// usage: go run ./scripts/gencerts -dir DIR NAME...
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/txmq/txmq/internal/certgen"
)

func main() {
	dir := flag.String("dir", ".", "directory to write the PEM files into (created if missing)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: gencerts -dir DIR NAME...")
		os.Exit(2)
	}
	if err := write(*dir, flag.Args()); err != nil {
		fmt.Fprintf(os.Stderr, "gencerts: %v\n", err)
		os.Exit(1)
	}
}

func write(dir string, names []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	ca, err := certgen.NewCA("txmq local CA")
	if err != nil {
		return err
	}
	for _, name := range names {
		if _, err := ca.WriteFiles(dir, name, "127.0.0.1", "localhost"); err != nil {
			return err
		}
	}
	return nil
}
