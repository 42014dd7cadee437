package clienttest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/internal/loopback"
	"github.com/txmq/txmq/internal/txmqtest"
)

// procCluster is three cmd/broker processes on 127.0.0.1, each with
// --rocketmq-listen (which it announces to the others), stopped by PID.
type procCluster struct {
	t     testing.TB
	ids   []string
	rmq   map[string]string // node ID → RocketMQ address
	api   map[string]string // node ID → gRPC address
	procs map[string]*exec.Cmd
	// exited is closed when the node's process has ended, killed or not.
	exited map[string]chan struct{}
}

// stableAddr is a free loopback address the cluster's processes are
// started on.
func stableAddr(t testing.TB) string {
	addr, err := loopback.StableAddr()
	require.NoError(t, err)
	return addr
}

func startProcCluster(t testing.TB) *procCluster {
	bin := filepath.Join(t.TempDir(), "broker")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/txmq/txmq/cmd/broker").CombinedOutput()
	require.NoError(t, err, "%s", out)
	pc := &procCluster{t: t, ids: []string{"n1", "n2", "n3"}, rmq: map[string]string{}, api: map[string]string{}, procs: map[string]*exec.Cmd{}, exited: map[string]chan struct{}{}}
	raft := map[string]string{}
	var raftPeers []string
	for _, id := range pc.ids {
		raft[id], pc.rmq[id], pc.api[id] = stableAddr(t), stableAddr(t), stableAddr(t)
		raftPeers = append(raftPeers, id+"="+raft[id])
	}
	for _, id := range pc.ids {
		cmd := exec.Command(bin, "--node-id", id, "--data", t.TempDir(), "--listen", pc.api[id],
			"--raft-listen", raft[id], "--peers", strings.Join(raftPeers, ","), "--metrics-listen", "",
			"--log-level", "error", "--rocketmq-listen", pc.rmq[id])
		// The nodes' logs (Raft complains of the killed one) are shown
		// only when the test fails.
		logPath := filepath.Join(t.TempDir(), id+".log")
		logFile, err := os.Create(logPath)
		require.NoError(t, err)
		cmd.Stderr = logFile
		require.NoError(t, cmd.Start())
		pc.procs[id] = cmd
		exited := make(chan struct{})
		pc.exited[id] = exited
		go func() { _ = cmd.Wait(); close(exited) }()
		t.Cleanup(func() {
			pc.kill(id)
			logFile.Close()
			if t.Failed() {
				b, _ := os.ReadFile(logPath)
				t.Logf("log of %s:\n%s", id, b)
			}
		})
	}
	return pc
}

// kill stops a node with SIGKILL and waits for it.
func (pc *procCluster) kill(id string) {
	cmd := pc.procs[id]
	if cmd == nil {
		return
	}
	delete(pc.procs, id)
	_ = cmd.Process.Kill()
	<-pc.exited[id]
}

// running fails the test at once if a node not killed has ended (its log
// is shown by the cleanup), instead of letting a wait for it run out.
func (pc *procCluster) running() {
	for id := range pc.procs {
		select {
		case <-pc.exited[id]:
			pc.t.Fatalf("%s ended by itself: %s", id, pc.procs[id].ProcessState)
		default:
		}
	}
}

// names are the nodes' RocketMQ addresses; apis their gRPC addresses.
func (pc *procCluster) names() []string { return pc.addrs(pc.rmq) }
func (pc *procCluster) apis() []string  { return pc.addrs(pc.api) }

func (pc *procCluster) addrs(of map[string]string) []string {
	var out []string
	for _, id := range pc.ids {
		out = append(out, of[id])
	}
	return out
}

// leader asks every running node for a route, in the remoting protocol
// written by hand, until they all name the same node, and returns its ID.
func (pc *procCluster) leader() string {
	var leader string
	txmqtest.CheckFor(pc.t, 60*time.Second, 50*time.Millisecond, func() error {
		pc.running()
		named := map[string]bool{}
		for id := range pc.procs {
			addr, err := routeOf(pc.rmq[id])
			if err != nil {
				return fmt.Errorf("%s: %v", id, err)
			}
			named[addr] = true
		}
		for lid, a := range pc.rmq {
			if named[a] && len(named) == 1 {
				leader = lid
				return nil
			}
		}
		return fmt.Errorf("the nodes name %v", named)
	})
	return leader
}

// routeOf sends GET_ROUTEINFO_BY_TOPIC and returns the broker address
// of the answer.
func routeOf(addr string) (string, error) {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(2 * time.Second))
	header := []byte(`{"code":105,"language":"GO","version":317,"opaque":1,"flag":0,"extFields":{"topic":"t"}}`)
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(header)))
	if _, err := nc.Write(append(frame, header...)); err != nil {
		return "", err
	}
	var lens [8]byte
	if _, err := io.ReadFull(nc, lens[:]); err != nil {
		return "", err
	}
	rest := make([]byte, binary.BigEndian.Uint32(lens[:4])-4)
	if _, err := io.ReadFull(nc, rest); err != nil {
		return "", err
	}
	hl := binary.BigEndian.Uint32(lens[4:]) & 0xFFFFFF
	var resp struct {
		Code int `json:"code"`
	}
	if err := json.Unmarshal(rest[:hl], &resp); err != nil || resp.Code != 0 {
		return "", fmt.Errorf("route answer %d: %v", resp.Code, err)
	}
	var route struct {
		BrokerDatas []struct {
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerDatas"`
	}
	if err := json.Unmarshal(rest[hl:], &route); err != nil || len(route.BrokerDatas) == 0 {
		return "", fmt.Errorf("route body: %v", err)
	}
	return route.BrokerDatas[0].BrokerAddrs["0"], nil
}
