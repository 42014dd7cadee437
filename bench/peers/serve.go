package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// serve runs one NATS server with JetStream until SIGTERM: the child
// process the bench starts three of.
func serve(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	name := fs.String("name", "n1", "server name")
	port := fs.Int("port", 0, "client port on 127.0.0.1")
	clusterPort := fs.Int("cluster-port", 0, "route port on 127.0.0.1")
	routes := fs.String("routes", "", "comma-separated nats-route:// URLs of the other servers")
	store := fs.String("store", "", "JetStream store directory")
	always := fs.Bool("sync-always", false, "fsync after every write (sync_interval: always); default: NATS's default sync_interval")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	opts := &server.Options{
		ServerName: *name,
		Host:       "127.0.0.1",
		Port:       *port,
		JetStream:  true,
		StoreDir:   *store,
		Cluster:    server.ClusterOpts{Name: "bench", Host: "127.0.0.1", Port: *clusterPort},
		Routes:     server.RoutesFromStr(*routes),
		NoSigs:     true,
		NoLog:      true,
		SyncAlways: *always,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintf(stderr, "peers serve: %v\n", err)
		return 1
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		fmt.Fprintln(stderr, "peers serve: not ready within 30s")
		return 1
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}
