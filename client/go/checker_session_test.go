package txmq_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/checkback"
	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/internal/txmqtest"
)

// longLease gives registrations a ten-minute lease and minute-long
// heartbeats, so that an instance that goes or comes back within a test
// did so because of its session, not its lease.
func longLease(cfg *broker.Config) {
	cfg.CheckBack = checkback.Config{HeartbeatInterval: time.Minute, Lease: 10 * time.Minute}
}

// listeningSockets counts the TCP sockets of this process in the LISTEN
// state: the socket inodes among its file descriptors, looked up in
// /proc/net/tcp and tcp6.
func listeningSockets(t *testing.T) int {
	t.Helper()
	fds, err := filepath.Glob("/proc/self/fd/*")
	require.NoError(t, err)
	mine := map[string]bool{}
	for _, fd := range fds {
		if target, err := os.Readlink(fd); err == nil && strings.HasPrefix(target, "socket:[") {
			mine[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) > 9 && fields[3] == "0A" && mine[fields[9]] {
				n++
			}
		}
		require.NoError(t, f.Close())
	}
	return n
}

// instances lists the registered producer instances of group on the node
// at addr, by instance ID.
func instances(t *testing.T, addr, group string) (map[string]*txmqv1.CallbackEndpoint, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	resp, err := txmqv1.NewAdminServiceClient(conn).ListProducers(t.Context(), &txmqv1.ListProducersRequest{ProducerGroup: group})
	if err != nil {
		return nil, err
	}
	out := map[string]*txmqv1.CallbackEndpoint{}
	for _, in := range resp.Instances {
		out[in.InstanceId] = in.Endpoint
	}
	return out, nil
}

func halfMessage(t *testing.T, addr, id string) (*txmqv1.HalfMessage, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	r, err := txmqv1.NewAdminServiceClient(conn).GetHalfMessage(t.Context(), &txmqv1.GetHalfMessageRequest{MessageId: id})
	if err != nil {
		return nil, err
	}
	return r.Message, nil
}

// A producer with a Checker and nothing else configured answers
// check-backs over its session: it opens no listening socket, the broker
// lists the instance with a session endpoint, and Close unregisters it at
// once.
func TestBrokerCheckBackOverSessionOpensNoPort(t *testing.T) {
	c := newBrokers(t, 1, longLease)
	addr := c.Leader().Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := &txLog{committed: map[string]bool{}}

	before := listeningSockets(t)
	require.Positive(t, before, "the broker's own listeners are counted")
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: []string{addr}, ProducerGroup: "shop", InstanceID: "shop-1", Checker: db.checker})
	require.NoError(t, err)
	require.Empty(t, p.CallbackAddr(), "no check-back server")
	list, err := instances(t, addr, "shop")
	require.NoError(t, err)
	require.NotEmpty(t, list["shop-1"].GetSession(), "registered on its session: %v", list)

	// The producer dies, for the broker's purposes, between its local
	// commit and Commit: check-back commits the message.
	id, err := p.SendHalf(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")}, txmq.WithCheckAfter(time.Second))
	require.NoError(t, err)
	db.commit("order-1:paid")
	txmqtest.CheckFor(t, 15*time.Second, 10*time.Millisecond, func() error {
		h, err := halfMessage(t, addr, id)
		if err != nil {
			return err
		}
		if h.State != txmqv1.HalfState_HALF_STATE_COMMITTED {
			return fmt.Errorf("half message is %s", h.State)
		}
		require.Equal(t, txmqv1.ResolutionSource_RESOLUTION_SOURCE_CHECKBACK, h.ResolutionSource)
		return nil
	})
	require.Equal(t, before, listeningSockets(t), "the producer opened no listening socket")

	require.NoError(t, p.Close())
	txmqtest.CheckFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		list, err := instances(t, addr, "shop")
		if err != nil {
			return err
		}
		if len(list) > 0 {
			return fmt.Errorf("still registered after Close: %v", list)
		}
		return nil
	})
}

// The leader is stopped while its check-back waits for the producer's
// answer. That check is lost with the leader (it did not count); the
// producer registers again on its session to the new leader at once
// (registrations here have a ten-minute lease and minute-long heartbeats),
// and the new leader checks again through the new session, as attempt 1,
// and commits the message.
func TestClusterCheckBackOverSessionFollowsLeader(t *testing.T) {
	c := newBrokers(t, 3, longLease)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var (
		mu       sync.Mutex
		attempts []uint32
		calls    atomic.Int32
	)
	first := make(chan struct{})
	release := make(chan struct{})
	checker := func(ctx context.Context, m txmq.HalfMessage) (txmq.Resolution, error) {
		mu.Lock()
		attempts = append(attempts, m.Attempt)
		mu.Unlock()
		if calls.Add(1) == 1 {
			close(first)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return txmq.Commit, nil
	}
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: c.Addrs(), ProducerGroup: "shop", InstanceID: "shop-1", Checker: checker})
	require.NoError(t, err)
	defer p.Close()
	id, err := p.SendHalf(ctx, "order-1:paid", txmq.Message{Topic: "orders", Body: []byte("paid")}, txmq.WithCheckAfter(time.Second))
	require.NoError(t, err)

	select {
	case <-first:
	case <-ctx.Done():
		t.Fatal("no check-back reached the producer")
	}
	old := c.Leader()
	c.Stop(old.Node().ID())
	close(release)

	txmqtest.CheckFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		leader, ok := c.CurrentLeader()
		if !ok {
			return fmt.Errorf("no leader")
		}
		h, err := halfMessage(t, leader.Addr(), id)
		if err != nil {
			return err
		}
		if h.State != txmqv1.HalfState_HALF_STATE_COMMITTED {
			return fmt.Errorf("half message is %s after %d check-backs", h.State, calls.Load())
		}
		return nil
	})
	leader := c.Leader()
	require.NotEqual(t, old.Node().ID(), leader.Node().ID())
	h, err := halfMessage(t, leader.Addr(), id)
	require.NoError(t, err)
	require.Equal(t, txmqv1.ResolutionSource_RESOLUTION_SOURCE_CHECKBACK, h.ResolutionSource)
	mu.Lock()
	require.Equal(t, []uint32{1, 1}, attempts, "the check lost with the leader was not counted")
	mu.Unlock()
	list, err := instances(t, leader.Addr(), "shop")
	require.NoError(t, err)
	require.NotEmpty(t, list["shop-1"].GetSession(), "registered on its session to the new leader")
	c.VerifyStores()
}

// Leadership moves to another node while the old leader keeps running: the
// old leader ends the sessions that carry check-backs, and the producer
// registers on the new leader at once, not at its next heartbeat (a
// minute away here).
func TestClusterSessionRegistrationFollowsTransfer(t *testing.T) {
	c := newBrokers(t, 3, longLease)
	p, err := txmq.NewProducer(txmq.ProducerConfig{Addrs: c.Addrs(), ProducerGroup: "shop", InstanceID: "shop-1",
		Checker: func(context.Context, txmq.HalfMessage) (txmq.Resolution, error) { return txmq.Commit, nil }})
	require.NoError(t, err)
	defer p.Close()
	old := c.Leader()
	list, err := instances(t, old.Addr(), "shop")
	require.NoError(t, err)
	require.Contains(t, list, "shop-1")

	require.NoError(t, old.Node().TransferLeadership(""))
	txmqtest.CheckFor(t, 15*time.Second, 20*time.Millisecond, func() error {
		leader, ok := c.CurrentLeader()
		if !ok || leader.Node().ID() == old.Node().ID() {
			return fmt.Errorf("leadership has not moved")
		}
		list, err := instances(t, leader.Addr(), "shop")
		if err != nil {
			return err
		}
		if list["shop-1"].GetSession() == "" {
			return fmt.Errorf("not registered on the new leader %s: %v", leader.Node().ID(), list)
		}
		return nil
	})
	c.VerifyStores()
}
