package main

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// leaderAndFollower starts a leader fake that accepts sends, half sends and
// topic creation, and a follower fake that names it.
func leaderAndFollower(t *testing.T) (leader, follower *fakeBroker, leaderAddr, followerAddr string) {
	t.Helper()
	leader = &fakeBroker{
		send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			return &txmqv1.SendResponse{MessageId: "m1", Sequence: 1}, nil
		},
		sendHalf: func(*txmqv1.SendHalfRequest) (*txmqv1.SendHalfResponse, error) {
			return &txmqv1.SendHalfResponse{MessageId: "h1", State: txmqv1.HalfState_HALF_STATE_PENDING}, nil
		},
		createTopic: func(req *txmqv1.CreateTopicRequest) (*txmqv1.CreateTopicResponse, error) {
			return &txmqv1.CreateTopicResponse{Topic: &txmqv1.Topic{Name: req.GetName()}, Created: true}, nil
		},
	}
	leaderAddr = leader.start(t)
	follower = &fakeBroker{}
	followerAddr = follower.start(t)
	follower.follow(leaderAddr)
	return leader, follower, leaderAddr, followerAddr
}

func TestWriteOnFollowerLandsOnLeader(t *testing.T) {
	leader, follower, _, followerAddr := leaderAndFollower(t)

	r := brokerctl(t, nil, "--addr", followerAddr, "send", "orders", "keyed", "--key", "k1")
	wantOK(t, r)
	if r.stdout != "m1\n" {
		t.Errorf("send printed %q", r.stdout)
	}
	// A follower's refusal is safe to retry even without a key: the
	// request did not take effect.
	wantOK(t, brokerctl(t, nil, "--addr", followerAddr, "send", "orders", "plain"))
	wantOK(t, brokerctl(t, nil, "--addr", followerAddr, "half", "send", "orders", "b", "--group", "shop", "--tx", "T"))
	r = brokerctl(t, map[string]string{"TXMQ_ADDR": followerAddr}, "topic", "create", "audit")
	wantOK(t, r)
	if r.stdout != "topic audit created\n" {
		t.Errorf("topic create printed %q", r.stdout)
	}

	want := []proto.Message{
		&txmqv1.SendRequest{Topic: "orders", Key: "k1", Body: []byte("keyed")},
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("plain")},
		&txmqv1.SendHalfRequest{Topic: "orders", ProducerGroup: "shop", TransactionId: "T", Body: []byte("b")},
		&txmqv1.CreateTopicRequest{Name: "audit"},
	}
	wantRequests(t, follower, want...)
	wantRequests(t, leader, want...)
}

func TestFirstAddressDead(t *testing.T) {
	leader, _, leaderAddr, followerAddr := leaderAndFollower(t)
	dead := deadAddress(t)

	// A refused connection never reached a broker: even a send without a
	// key goes on to the next address.
	wantOK(t, brokerctl(t, nil, "--addr", dead+","+leaderAddr, "send", "orders", "one"))
	// Spaces around the commas are fine; the follower sends it on to the
	// leader.
	wantOK(t, brokerctl(t, map[string]string{"TXMQ_ADDR": dead + " , " + followerAddr}, "send", "orders", "two"))
	wantRequests(t, leader,
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("one")},
		&txmqv1.SendRequest{Topic: "orders", Body: []byte("two")})
}

func TestAllAddressesDead(t *testing.T) {
	dead1, dead2 := deadAddress(t), deadAddress(t)
	r := brokerctl(t, nil, "--addr", dead1+","+dead2, "--timeout", "500ms", "topic", "list")
	// Both are tried, round after round, until --timeout; the last error is
	// printed: the one of the last address tried, either of them.
	if r.code != exitFailure || !strings.HasPrefix(r.stderr, "brokerctl: Unavailable: ") ||
		!strings.HasSuffix(r.stderr, " (gave up after retrying for --timeout 500ms)\n") ||
		!strings.Contains(r.stderr, dead1) && !strings.Contains(r.stderr, dead2) || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("exit code %d, stderr %q; want 1 and the Unavailable of %s or %s", r.code, r.stderr, dead1, dead2)
	}
}

func TestRedirectLoopIsBounded(t *testing.T) {
	a, b := &fakeBroker{}, &fakeBroker{}
	addrA, addrB := a.start(t), b.start(t)
	a.follow(addrB)
	b.follow(addrA)

	// The call goes back and forth with backoff until --timeout, and the
	// last refusal is printed, from either node.
	start := time.Now()
	r := brokerctl(t, nil, "--addr", addrA, "--timeout", "1s", "send", "orders", "b", "--key", "k")
	prefix := "brokerctl: Unavailable: not the leader (gave up after retrying for --timeout 1s) (retry with --addr "
	if r.code != exitFailure || r.stderr != prefix+addrA+")\n" && r.stderr != prefix+addrB+")\n" {
		t.Errorf("exit code %d, stderr %q", r.code, r.stderr)
	}
	// Backoff, not a tight loop: a few tries a second at the most, after
	// the first ones.
	if got := len(a.recorded()) + len(b.recorded()); got < 4 || got > 30 {
		t.Errorf("the nodes got %d requests, want 4 to 30", got)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}

	// After maxRedirects in a row, the next address of the list is tried.
	c := &fakeBroker{send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return &txmqv1.SendResponse{MessageId: "m9"}, nil
	}}
	addrC := c.start(t)
	before := len(a.recorded()) + len(b.recorded())
	r = brokerctl(t, nil, "--addr", addrA+","+addrB+","+addrC, "send", "orders", "b", "--key", "k")
	wantOK(t, r)
	if r.stdout != "m9\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if got := len(a.recorded()) + len(b.recorded()) - before; got != 4 {
		t.Errorf("the looping nodes got %d requests, want 4: the first and 3 redirects", got)
	}
	wantRequests(t, c, &txmqv1.SendRequest{Topic: "orders", Key: "k", Body: []byte("b")})
}

func TestAmbiguousUnavailable(t *testing.T) {
	noQuorum := &fakeBroker{
		send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			return nil, status.Error(codes.Unavailable, "no quorum")
		},
		listTopics: func(*txmqv1.ListTopicsRequest) (*txmqv1.ListTopicsResponse, error) {
			return nil, status.Error(codes.Unavailable, "shutting down")
		},
	}
	other := &fakeBroker{
		send: func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			return &txmqv1.SendResponse{MessageId: "m2"}, nil
		},
		listTopics: func(*txmqv1.ListTopicsRequest) (*txmqv1.ListTopicsResponse, error) {
			return &txmqv1.ListTopicsResponse{Topics: []*txmqv1.Topic{{Name: "orders"}}}, nil
		},
	}
	addrs := noQuorum.start(t) + "," + other.start(t)

	// Without a key the broker would not deduplicate a second copy: a send
	// that reached a node and failed there is not sent elsewhere.
	r := brokerctl(t, nil, "--addr", addrs, "send", "orders", "plain")
	if want := "brokerctl: Unavailable: no quorum (not retried: the request may have taken effect)\n"; r.code != exitFailure || r.stderr != want {
		t.Errorf("exit code %d, stderr %q; want 1, %q", r.code, r.stderr, want)
	}
	// With a key, and for reads, the next node is asked.
	r = brokerctl(t, nil, "--addr", addrs, "send", "orders", "keyed", "--key", "k")
	wantOK(t, r)
	r = brokerctl(t, nil, "--addr", addrs, "-o", "json", "topic", "list")
	wantOK(t, r)
	if !strings.HasPrefix(r.stdout, `{"topic":"orders"`) {
		t.Errorf("topic list printed %q", r.stdout)
	}
	wantRequests(t, other,
		&txmqv1.SendRequest{Topic: "orders", Key: "k", Body: []byte("keyed")},
		&txmqv1.ListTopicsRequest{})
}

func TestConsumeFollowsNotLeaderAtSubscribe(t *testing.T) {
	leader := &fakeBroker{}
	leader.serveDeliveries(true, delivery("m1", 1, "", "hello"), delivery("m2", 1, "", "world"))
	follower := &fakeBroker{}
	follower.follow(leader.start(t))
	followerAddr := follower.start(t)

	r := brokerctl(t, nil, "--addr", followerAddr, "consume", "orders", "--group", "points", "--count", "2")
	wantOK(t, r)
	if want := "m1  attempt=1  key=  hello\nm2  attempt=1  key=  world\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	start := subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 2)
	wantRequests(t, follower, start)
	wantRequests(t, leader, start, ack("m1"), ack("m2"))
}

// losesLeadership scripts Subscribe: it accepts the subscription, pushes the
// deliveries, reads one ack per delivery without confirming it, and ends
// the stream with end. Later subscriptions get refuse.
func losesLeadership(f *fakeBroker, end, refuse func() error, deliveries ...*txmqv1.Delivery) {
	var mu sync.Mutex
	served := false
	f.subscribe = func(stream txmqv1.ConsumerService_SubscribeServer) error {
		start, err := stream.Recv()
		if err != nil {
			return err
		}
		f.record(start)
		mu.Lock()
		again := served
		served = true
		mu.Unlock()
		if again {
			return refuse()
		}
		if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Subscribed{Subscribed: &txmqv1.Subscribed{}}}); err != nil {
			return err
		}
		for _, d := range deliveries {
			if err := stream.Send(&txmqv1.SubscribeResponse{Kind: &txmqv1.SubscribeResponse_Delivery{Delivery: d}}); err != nil {
				return err
			}
		}
		for range deliveries {
			req, err := stream.Recv()
			if err != nil {
				return err
			}
			f.record(req)
		}
		return end()
	}
}

func TestConsumeReconnectsToNewLeader(t *testing.T) {
	newLeader := &fakeBroker{}
	// The acks of m2 were not durable: m2 comes again.
	newLeader.serveDeliveries(true, delivery("m2", 2, "", "world"), delivery("m3", 1, "", "again"))
	newAddr := newLeader.start(t)
	old := &fakeBroker{}
	losesLeadership(old,
		func() error { return notLeaderError("leadership lost", newAddr) },
		func() error { return notLeaderError("not the leader", newAddr) },
		delivery("m1", 1, "", "hello"), delivery("m2", 1, "", "world"))
	oldAddr := old.start(t)

	r := brokerctl(t, nil, "--addr", oldAddr, "consume", "orders", "--group", "points", "--count", "4")
	if r.code != exitOK {
		t.Fatalf("exit code %d, stderr %q", r.code, r.stderr)
	}
	want := "m1  attempt=1  key=  hello\nm2  attempt=1  key=  world\nm2  attempt=2  key=  world\nm3  attempt=1  key=  again\n"
	if r.stdout != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", r.stdout, want)
	}
	if want := "brokerctl: the stream ended (Unavailable: leadership lost); subscribed again on " + newAddr + "\n"; r.stderr != want {
		t.Errorf("stderr %q, want %q", r.stderr, want)
	}
	wantRequests(t, old, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 4), ack("m1"), ack("m2"))
	// The window is what is left of --count.
	wantRequests(t, newLeader, subscription("orders", "points", txmqv1.StartPosition_START_POSITION_EARLIEST, 2), ack("m2"), ack("m3"))
}

func TestConsumeReconnectsAfterElection(t *testing.T) {
	// The stream ends without naming a leader, and for the first rounds no
	// node knows one yet.
	var mu sync.Mutex
	refusals := 0
	election := func(leader *string) func() error {
		return func() error {
			mu.Lock()
			defer mu.Unlock()
			if refusals < 4 {
				refusals++
				return notLeaderError("no leader yet", "")
			}
			return notLeaderError("not the leader", *leader)
		}
	}
	var newAddr string
	newLeader := &fakeBroker{}
	newLeader.serveDeliveries(true, delivery("m2", 1, "", "world"))
	old := &fakeBroker{}
	losesLeadership(old,
		func() error { return status.Error(codes.Unavailable, "node shutting down") },
		election(&newAddr),
		delivery("m1", 1, "", "hello"))
	other := &fakeBroker{}
	other.subscribe = func(stream txmqv1.ConsumerService_SubscribeServer) error {
		if _, err := stream.Recv(); err != nil {
			return err
		}
		return election(&newAddr)()
	}
	oldAddr, otherAddr := old.start(t), other.start(t)
	mu.Lock()
	newAddr = newLeader.start(t)
	mu.Unlock()

	r := brokerctl(t, nil, "--addr", oldAddr+","+otherAddr, "consume", "orders", "--group", "points", "--count", "2")
	if r.code != exitOK {
		t.Fatalf("exit code %d, stderr %q", r.code, r.stderr)
	}
	if want := "m1  attempt=1  key=  hello\nm2  attempt=1  key=  world\n"; r.stdout != want {
		t.Errorf("stdout %q, want %q", r.stdout, want)
	}
	if want := "brokerctl: the stream ended (Unavailable: node shutting down); subscribed again on " + newAddr + "\n"; r.stderr != want {
		t.Errorf("stderr %q", r.stderr)
	}
	mu.Lock()
	defer mu.Unlock()
	if refusals != 4 {
		t.Errorf("%d refusals while there was no leader, want 4", refusals)
	}
}

func TestConsumeReconnectGivesUp(t *testing.T) {
	old := &fakeBroker{}
	losesLeadership(old,
		func() error { return status.Error(codes.Unavailable, "leadership lost") },
		func() error { return notLeaderError("no leader yet", "") },
		delivery("m1", 1, "", "hello"))
	addr := old.start(t)

	start := time.Now()
	r := brokerctl(t, nil, "--addr", addr, "consume", "orders", "--group", "points", "--wait", "1h", "--timeout", "300ms")
	if r.code != exitFailure || !strings.HasSuffix(r.stderr, "brokerctl: Unavailable: no leader yet (gave up after retrying for --timeout 300ms)\n") {
		t.Errorf("exit code %d, stderr %q", r.code, r.stderr)
	}
	if r.stdout != "m1  attempt=1  key=  hello\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
	if n := len(old.recorded()); n < 4 {
		t.Errorf("the node got %d requests; want the start, the ack and more than one try to subscribe again", n)
	}
}

// silentAddress returns an address that accepts connections and never
// answers, like a host that hangs.
func silentAddress(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		lis.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, conn := range conns {
			conn.Close()
		}
	})
	return lis.Addr().String()
}

func TestSilentFirstAddress(t *testing.T) {
	leader, _, leaderAddr, _ := leaderAndFollower(t)

	// The silent node gets its share of --timeout, half of it here, to
	// connect, and the next one the rest: the call does not time out.
	r := brokerctl(t, nil, "--addr", silentAddress(t)+","+leaderAddr, "--timeout", "2s", "send", "orders", "b")
	wantOK(t, r)
	wantRequests(t, leader, &txmqv1.SendRequest{Topic: "orders", Body: []byte("b")})
}

// electing is a pair of fakes during an election: for the first refusals
// Sends, both answer that there is no leader; after that the second one is
// the leader and the first names it.
func electing(t *testing.T, refusals int) (first, second *fakeBroker, addrs string, refused func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	var secondAddr string
	send := func(leader bool) func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
		return func(*txmqv1.SendRequest) (*txmqv1.SendResponse, error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case n < refusals:
				n++
				return nil, notLeaderError("not the leader, and no leader is known (election in progress or no quorum)", "")
			case leader:
				return &txmqv1.SendResponse{MessageId: "m1", Sequence: 1}, nil
			default:
				return nil, notLeaderError("not the leader", secondAddr)
			}
		}
	}
	first = &fakeBroker{send: send(false)}
	second = &fakeBroker{send: send(true)}
	firstAddr := first.start(t)
	mu.Lock()
	secondAddr = second.start(t)
	mu.Unlock()
	return first, second, firstAddr + "," + secondAddr, func() int {
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}

// While no node knows a leader, a write is retried on every address with
// backoff; once there is a leader, it lands there, once. A follower's
// refusal is safe to retry even for a send without a key.
func TestWriteRetriedThroughAnElection(t *testing.T) {
	first, second, addrs, refused := electing(t, 6)

	r := brokerctl(t, nil, "--addr", addrs, "send", "orders", "plain")
	wantOK(t, r)
	if r.stdout != "m1\n" {
		t.Errorf("stdout %q", r.stdout)
	}
	if n := refused(); n != 6 {
		t.Errorf("%d refusals before the leader answered, want 6", n)
	}
	sent := &txmqv1.SendRequest{Topic: "orders", Body: []byte("plain")}
	got := append(first.recorded(), second.recorded()...)
	if len(got) < 7 {
		t.Errorf("the nodes got %d requests, want the 6 refused and the one that landed", len(got))
	}
	for _, req := range got {
		if !proto.Equal(req, sent) {
			t.Errorf("request %v, want %v", req, sent)
		}
	}
	if got := second.recorded(); len(got) < 4 {
		t.Errorf("the leader got %d requests; want its share of the refusals and the send", len(got))
	}
}

// When the election outlasts --timeout, the write gives up with the last
// refusal, and says that --timeout ended the retries.
func TestWriteGivesUpAfterTimeout(t *testing.T) {
	first, second, addrs, refused := electing(t, 1<<30)

	start := time.Now()
	r := brokerctl(t, nil, "--addr", addrs, "--timeout", "500ms", "send", "orders", "b", "--key", "k")
	want := "brokerctl: Unavailable: not the leader, and no leader is known (election in progress or no quorum) (gave up after retrying for --timeout 500ms)\n"
	if r.code != exitFailure || r.stderr != want || r.stdout != "" {
		t.Errorf("exit code %d, stdout %q, stderr %q; want 1, nothing, %q", r.code, r.stdout, r.stderr, want)
	}
	if n := refused(); n < 3 || n != len(first.recorded())+len(second.recorded()) {
		t.Errorf("%d refusals, from %d+%d requests; want several, one per request", n, len(first.recorded()), len(second.recorded()))
	}
	if len(first.recorded()) == 0 || len(second.recorded()) == 0 {
		t.Errorf("requests %d and %d: want both addresses tried", len(first.recorded()), len(second.recorded()))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s", d)
	}
}
