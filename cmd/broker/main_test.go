package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// brokerBin builds the broker once per test binary run.
func brokerBin(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "broker")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return bin
}

// anyPort is what the tests pass for every address the broker listens
// on: it binds a free port itself and prints it, so that no test chooses a
// port, closes it and hands it over, racing with whatever else binds ports.
const anyPort = "127.0.0.1:0"

type proc struct {
	cmd   *exec.Cmd
	addr  string        // the gRPC address it printed
	pprof string        // the pprof address it printed, if it serves pprof
	rmq   string        // the RocketMQ address it printed, if it serves RocketMQ
	done  chan struct{} // closed when the process has exited
	err   error         // its exit status, once done
}

var (
	listenRE = regexp.MustCompile(`gRPC on (\S+),`)
	pprofRE  = regexp.MustCompile(`^pprof on http://([^/]+)/`)
	rmqRE    = regexp.MustCompile(`^RocketMQ remoting \(name server and broker\) on (\S+)$`)
)

// startProc starts the broker binary and waits until it is the leader.
func startProc(t *testing.T, bin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, done: make(chan struct{})}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		close(lines)
		p.err = cmd.Wait()
		close(p.done)
	}()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "broker exited before it was ready")
			if m := listenRE.FindStringSubmatch(l); m != nil {
				p.addr = m[1]
			}
			if m := pprofRE.FindStringSubmatch(l); m != nil {
				p.pprof = m[1]
			}
			if m := rmqRE.FindStringSubmatch(l); m != nil {
				p.rmq = m[1]
			}
			if strings.HasPrefix(l, "ready:") {
				require.NotEmpty(t, p.addr)
				return p
			}
		case <-deadline:
			t.Fatal("broker not ready within 30s")
		}
	}
}

func clients(t *testing.T, addr string) (txmqv1.ProducerServiceClient, txmqv1.ConsumerServiceClient, txmqv1.AdminServiceClient) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return txmqv1.NewProducerServiceClient(conn), txmqv1.NewConsumerServiceClient(conn), txmqv1.NewAdminServiceClient(conn)
}

// Kill -9 after acknowledged commits: everything acknowledged survives, the
// pending half message is still pending, acked messages are not delivered
// again, and the restart does not re-apply the log.
func TestKill9KeepsAcknowledgedWork(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	bin := brokerBin(t)
	t.Run("kill -9", func(t *testing.T) { testKill9(t, bin, false) })
	// fsm.db is not fsynced per batch: after a power cut (simulated by the
	// marker of another boot) it is rebuilt from the Raft log.
	t.Run("power cut", func(t *testing.T) {
		if _, err := os.Stat("/proc/sys/kernel/random/boot_id"); err != nil {
			t.Skip("no boot ID on this system: fsm.db is fsynced on every batch")
		}
		testKill9(t, bin, true)
	})
}

func testKill9(t *testing.T, bin string, powerCut bool) {
	data := t.TempDir()
	// The restart binds new ports too: a single node follows.
	args := []string{"--data", data, "--listen", anyPort, "--raft-listen", anyPort, "--metrics-listen", anyPort, "--log-level", "warn"}
	p := startProc(t, bin, args...)
	producer, consumer, admin := clients(t, p.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const n = 200
	committed := map[string]bool{}
	for i := 0; i < n; i++ {
		r, err := producer.SendHalf(ctx, &txmqv1.SendHalfRequest{
			Topic: "orders", ProducerGroup: "shop", TransactionId: fmt.Sprint("order-", i), Body: []byte(fmt.Sprint("body-", i)),
		})
		require.NoError(t, err)
		_, err = producer.EndTransaction(ctx, &txmqv1.EndTransactionRequest{
			Target: &txmqv1.EndTransactionRequest_MessageId{MessageId: r.MessageId}, Resolution: txmqv1.Resolution_RESOLUTION_COMMIT,
		})
		require.NoError(t, err)
		committed[r.MessageId] = true
	}
	pending, err := producer.SendHalf(ctx, &txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "pending", Body: []byte("p")})
	require.NoError(t, err)

	// Consume and ack the first half of them, durably.
	acked := consumeAndAck(t, ctx, consumer, n/2)
	before, err := admin.ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
	require.NoError(t, err)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	<-p.done
	if powerCut {
		require.FileExists(t, filepath.Join(data, "fsm.db.unsynced"))
		require.NoError(t, os.WriteFile(filepath.Join(data, "fsm.db.unsynced"), []byte("a boot before the power cut\n"), 0o600))
	}

	p = startProc(t, bin, args...)
	_, consumer, admin = clients(t, p.addr)
	after, err := admin.ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{})
	require.NoError(t, err)
	require.GreaterOrEqual(t, after.StoreAppliedIndex, before.StoreAppliedIndex, "the applied index survives the crash")

	h, err := admin.GetHalfMessage(ctx, &txmqv1.GetHalfMessageRequest{MessageId: pending.MessageId})
	require.NoError(t, err)
	require.Equal(t, txmqv1.HalfState_HALF_STATE_PENDING, h.Message.State)

	rest := consumeAndAck(t, ctx, consumer, n/2)
	for id := range rest {
		require.False(t, acked[id], "acked message %s delivered again after the crash", id)
		acked[id] = true
	}
	require.Equal(t, committed, acked, "every acknowledged commit is delivered")
}

// consumeAndAck acks the first n deliveries of group "points" (later ones
// stay unacked) and returns once every ack is confirmed durable.
func consumeAndAck(t *testing.T, ctx context.Context, consumer txmqv1.ConsumerServiceClient, n int) map[string]bool {
	t.Helper()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := consumer.Subscribe(sctx)
	require.NoError(t, err)
	require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Start{Start: &txmqv1.SubscriptionStart{
		Topic: "orders", ConsumerGroup: "points", MaxInFlight: uint32(n),
	}}}))
	got := map[string]bool{}
	confirmed := 0
	for confirmed < n {
		m, err := stream.Recv()
		require.NoError(t, err)
		if d := m.GetDelivery(); d != nil && len(got) < n {
			require.False(t, got[d.MessageId], "delivered twice in one session")
			got[d.MessageId] = true
			require.NoError(t, stream.Send(&txmqv1.SubscribeRequest{Kind: &txmqv1.SubscribeRequest_Ack{Ack: &txmqv1.AckRequest{MessageIds: []string{d.MessageId}}}}))
		}
		confirmed += len(m.GetAckConfirm().GetMessageIds())
	}
	return got
}

// SIGTERM shuts down cleanly with exit code 0.
func TestSigtermExitsCleanly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	bin := brokerBin(t)
	p := startProc(t, bin, "--data", t.TempDir(), "--listen", anyPort, "--raft-listen", anyPort, "--metrics-listen", "", "--log-level", "warn")
	producer, _, _ := clients(t, p.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := producer.Send(ctx, &txmqv1.SendRequest{Topic: "t", Body: []byte("x")})
	require.NoError(t, err)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.done:
		require.NoError(t, p.err)
	case <-time.After(20 * time.Second):
		t.Fatal("broker did not exit within 20s of SIGTERM")
	}
}

func TestFlagErrors(t *testing.T) {
	var out, errOut strings.Builder
	require.Equal(t, 2, run([]string{"--log-format", "xml"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--log-format")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"extra"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "unexpected argument")
	errOut.Reset()
	// Out-of-range settings are refused when the flags are read, with the
	// bounds the admin API applies too.
	require.Equal(t, 2, run([]string{"--data", t.TempDir(), "--ack-deadline", "1ns", "--metrics-listen", ""}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--ack-deadline 1ns is outside 1s..12h0m0s")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--ack-deadline", "0"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--ack-deadline 0s is outside", "0 is refused, not read as the default")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--redelivery-backoff", "1s,soon"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), `--redelivery-backoff: "soon"`)
	errOut.Reset()
	require.Equal(t, 1, run([]string{"--data", t.TempDir(), "--redelivery-backoff", "1s,-5s", "--metrics-listen", ""}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "RedeliveryBackoff: step 2")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--data", t.TempDir(), "--max-deliveries", "5000", "--metrics-listen", ""}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--max-deliveries")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--data", t.TempDir(), "--retention", "10ms", "--metrics-listen", ""}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--retention")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--raft-log-store", "rocksdb"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "use wal or bolt")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--expiry-action", "delete"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "park or rollback")
	errOut.Reset()
	require.Equal(t, 1, run([]string{"--data", t.TempDir(), "--check-backoff", "2m", "--max-check-backoff", "1m", "--metrics-listen", ""}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "backoff")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--pprof-listen", "0.0.0.0:6060"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "loopback")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--rocketmq-listen", "0.0.0.0:9876"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--insecure")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--rocketmq-listen", "0.0.0.0:0", "--insecure"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--rocketmq-advertise")
	errOut.Reset()
	require.Equal(t, 1, run([]string{"--data", t.TempDir(), "--metrics-listen", "", "--rocketmq-listen", "127.0.0.1:0", "--rocketmq-advertise", "[::1]:9876"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "IPv4")
	errOut.Reset()
	require.Equal(t, 2, run([]string{"--rocketmq-listen", "127.0.0.1:0", "--auth-file", "auth.yaml"}, noEnv, &out, &errOut))
	require.Contains(t, errOut.String(), "--auth-file")
}

func TestPprofListen(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	bin := brokerBin(t)
	p := startProc(t, bin, "--data", t.TempDir(), "--listen", anyPort, "--raft-listen", anyPort, "--metrics-listen", "", "--log-level", "warn", "--pprof-listen", anyPort)
	require.NotEmpty(t, p.pprof, "the pprof address is printed")
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + p.pprof + "/debug/pprof/heap?debug=1")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), "heap profile")
}

// The binary serves the RocketMQ protocol on --rocketmq-listen: a route
// query, written by hand in the remoting frame format, names it.
func TestRocketMQListen(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the broker binary")
	}
	bin := brokerBin(t)
	p := startProc(t, bin, "--data", t.TempDir(), "--listen", anyPort, "--raft-listen", anyPort, "--metrics-listen", "", "--log-level", "warn", "--rocketmq-listen", anyPort)
	require.NotEmpty(t, p.rmq, "the RocketMQ address is printed")
	nc, err := net.DialTimeout("tcp", p.rmq, 10*time.Second)
	require.NoError(t, err)
	defer nc.Close()
	header := []byte(`{"code":105,"language":"GO","version":317,"opaque":1,"flag":0,"extFields":{"topic":"orders"}}`)
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(header)))
	_, err = nc.Write(append(frame, header...))
	require.NoError(t, err)
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var lens [8]byte
	_, err = io.ReadFull(nc, lens[:])
	require.NoError(t, err)
	rest := make([]byte, binary.BigEndian.Uint32(lens[:4])-4)
	_, err = io.ReadFull(nc, rest)
	require.NoError(t, err)
	hl := binary.BigEndian.Uint32(lens[4:]) & 0xFFFFFF
	var resp struct {
		Code   int `json:"code"`
		Opaque int `json:"opaque"`
	}
	require.NoError(t, json.Unmarshal(rest[:hl], &resp))
	require.Equal(t, 0, resp.Code)
	require.Equal(t, 1, resp.Opaque)
	require.Contains(t, string(rest[hl:]), p.rmq, "the route names this node")
}
