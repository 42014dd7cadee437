package window

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// recorder is a listener whose connections keep a copy of the bytes each
// way, to read the HTTP/2 frames back.
type recorder struct {
	net.Listener
	mu       sync.Mutex
	in, out  bytes.Buffer // client → server, server → client
	accepted int
}

func (r *recorder) Accept() (net.Conn, error) {
	c, err := r.Listener.Accept()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.accepted++
	r.mu.Unlock()
	return &recorded{Conn: c, r: r}, nil
}

type recorded struct {
	net.Conn
	r *recorder
}

func (c *recorded) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.r.mu.Lock()
	c.r.in.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}

func (c *recorded) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.r.mu.Lock()
	c.r.out.Write(p[:n])
	c.r.mu.Unlock()
	return n, err
}

// pings counts the PING frames (not their acks) in b, HTTP/2 frames after
// skip bytes.
func pings(t *testing.T, b []byte, skip int) int {
	t.Helper()
	f := http2.NewFramer(io.Discard, bytes.NewReader(b[skip:]))
	f.SetMaxReadFrameSize(1 << 24)
	n := 0
	for {
		fr, err := f.ReadFrame()
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return n
		}
		if err != nil {
			t.Fatalf("reading the frames back: %v", err)
		}
		if p, ok := fr.(*http2.PingFrame); ok && !p.IsAck() {
			n++
		}
	}
}

// callsWith makes calls a few hundred microseconds apart, as a producer
// does, between a server and a client with the given options, and counts
// the PINGs each side sent.
func callsWith(t *testing.T, sopts []grpc.ServerOption, dopts []grpc.DialOption) (fromClient, fromServer int) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{Listener: ln}
	srv := grpc.NewServer(sopts...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { _ = srv.Serve(rec) }()
	cc, err := grpc.NewClient(ln.Addr().String(), append(dopts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := healthpb.NewHealthClient(cc)
	for range 50 {
		if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Microsecond)
	}
	cc.Close()
	srv.Stop()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if rec.accepted != 1 {
		t.Fatalf("want the calls on one connection, got %d", rec.accepted)
	}
	return pings(t, rec.in.Bytes(), len(http2.ClientPreface)), pings(t, rec.out.Bytes(), 0)
}

// TestNoBandwidthPings: with gRPC's dynamic windows both sides ping the
// other as small calls come and go (which the test must see, or it proves
// nothing); with the API's static windows neither does.
func TestNoBandwidthPings(t *testing.T) {
	c, s := callsWith(t, nil, nil)
	if c == 0 || s == 0 {
		t.Fatalf("with gRPC's default windows the client sent %d PINGs and the server %d: the test cannot tell them apart from static windows", c, s)
	}
	t.Logf("default windows: %d PINGs from the client, %d from the server, over 50 calls", c, s)
	c, s = callsWith(t, ServerOptions(), DialOptions())
	if c != 0 || s != 0 {
		t.Fatalf("with static windows the client sent %d PINGs and the server %d, want none", c, s)
	}
}
