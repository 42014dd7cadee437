package rocketmq

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/broker"
	"github.com/txmq/txmq/internal/txmqtest"
)

func TestMain(m *testing.M) { txmqtest.VerifyTestMain(m) }

// newServer is a one-node broker with the front end on 127.0.0.1:0.
func newServer(t *testing.T) *Server {
	c := txmqtest.NewCluster(t, 1, func(s txmqtest.Spec) (*broker.Broker, error) {
		return broker.Open(broker.Config{Raft: s.Raft, GRPCListener: s.API, Logger: txmqtest.Logger()})
	})
	lis, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	s, err := Serve(lis, Config{Broker: c.Leader(), Logger: txmqtest.Logger(), MaxPollWait: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return s
}

// call writes one request and reads one answer.
func call(t *testing.T, nc net.Conn, r *bufio.Reader, req *command) *command {
	t.Helper()
	f, err := encode(req)
	require.NoError(t, err)
	_, err = nc.Write(f)
	require.NoError(t, err)
	nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	frame, err := readFrame(r)
	require.NoError(t, err)
	resp, err := decode(frame)
	require.NoError(t, err)
	require.True(t, resp.response())
	require.Equal(t, req.Opaque, resp.Opaque)
	return resp
}

func dial(t *testing.T, s *Server) (net.Conn, *bufio.Reader) {
	nc, err := net.Dial("tcp", s.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	return nc, bufio.NewReader(nc)
}

func TestUnknownCodeAndOneway(t *testing.T) {
	s := newServer(t)
	nc, r := dial(t, s)
	resp := call(t, nc, r, &command{Code: 9999, Opaque: 7})
	require.Equal(t, int16(codeNotSupported), resp.Code)
	require.Contains(t, resp.Remark, "9999")

	// A one-way request gets no answer: the next answer read is the
	// route query's.
	f, err := encode(&command{Code: 9999, Opaque: 8, Flag: flagOneway})
	require.NoError(t, err)
	_, err = nc.Write(f)
	require.NoError(t, err)
	resp = call(t, nc, r, &command{Code: reqGetRouteByTopic, Opaque: 9, ExtFields: map[string]string{"topic": "orders"}})
	require.Equal(t, int16(codeSuccess), resp.Code)
	var route struct {
		QueueDatas []struct {
			ReadQueueNums int `json:"readQueueNums"`
		} `json:"queueDatas"`
		BrokerDatas []struct {
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerDatas"`
	}
	require.NoError(t, json.Unmarshal(resp.Body, &route))
	require.Equal(t, 4, route.QueueDatas[0].ReadQueueNums)
	require.Equal(t, s.Addr(), route.BrokerDatas[0].BrokerAddrs["0"])
}

func TestBadFramesCloseTheConnection(t *testing.T) {
	s := newServer(t)
	for name, frame := range map[string][]byte{
		"huge length":     binary.BigEndian.AppendUint32(nil, MaxFrame+1),
		"bad json":        append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 4+5), 5), "{nope"...),
		"header too long": binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 4), 1000),
		"binary header":   append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 4+2), 1<<24|2), "{}"...),
	} {
		t.Run(name, func(t *testing.T) {
			nc, r := dial(t, s)
			_, err := nc.Write(frame)
			require.NoError(t, err)
			nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, err = r.ReadByte()
			require.Error(t, err, "the broker answers nothing and closes")
			var ne net.Error
			if ok := asNetErr(err, &ne); ok {
				require.False(t, ne.Timeout(), "closed, not left hanging")
			}
		})
	}
}

func asNetErr(err error, ne *net.Error) bool {
	e, ok := err.(net.Error)
	if ok {
		*ne = e
	}
	return ok
}

// A client that sends requests and never reads is disconnected; the
// broker goes on serving others.
func TestClientThatStopsReading(t *testing.T) {
	s := newServer(t)
	nc, _ := dial(t, s)
	f, err := encode(&command{Code: reqGetRouteByTopic, ExtFields: map[string]string{"topic": "t"}, Body: make([]byte, 64<<10)})
	require.NoError(t, err)
	nc.(*net.TCPConn).SetReadBuffer(4 << 10)
	done := make(chan error, 1)
	go func() {
		for {
			nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
			if _, err := nc.Write(f); err != nil {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the broker kept a client that does not read")
	}
	other, r := dial(t, s)
	resp := call(t, other, r, &command{Code: 9999, Opaque: 1})
	require.Equal(t, int16(codeNotSupported), resp.Code)
}

func TestStoredMessageAndProperties(t *testing.T) {
	host := netip.MustParseAddrPort("127.0.0.1:9876")
	id := offsetMsgID(host, 42)
	require.Len(t, id, 32)
	require.Equal(t, "7F00000100002694000000000000002A", id)
	props := map[string]string{"UNIQ_KEY": "abc", "TAGS": "t1"}
	require.Equal(t, props, decodeProperties(encodeProperties(props)))
	b := appendStored(nil, &stored{topic: "orders", body: []byte("hi"), host: host, props: props})
	require.Equal(t, int(binary.BigEndian.Uint32(b)), len(b))
}

func TestDecodeBatch(t *testing.T) {
	enc := func(body string, props string) []byte {
		size := 20 + len(body) + 2 + len(props)
		b := binary.BigEndian.AppendUint32(nil, uint32(size))
		b = binary.BigEndian.AppendUint32(b, 0)
		b = binary.BigEndian.AppendUint32(b, 0)
		b = binary.BigEndian.AppendUint32(b, 0)
		b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
		b = append(b, body...)
		b = binary.BigEndian.AppendUint16(b, uint16(len(props)))
		return append(b, props...)
	}
	items, err := decodeBatch(append(enc("a", "UNIQ_KEY\x01k1\x02"), enc("bb", "")...))
	require.NoError(t, err)
	require.Len(t, items, 2)
	require.Equal(t, "k1", items[0].props["UNIQ_KEY"])
	require.Equal(t, []byte("bb"), items[1].body)
	_, err = decodeBatch(enc("a", "")[:10])
	require.Error(t, err)
}

func FuzzDecode(f *testing.F) {
	good, _ := encode(&command{Code: 10, Opaque: 1, ExtFields: map[string]string{"a": "g"}, Body: []byte("body")})
	f.Add(good[4:])
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, frame []byte) {
		c, err := decode(frame)
		if err != nil {
			return
		}
		again, err := encode(c)
		if err != nil {
			return
		}
		c2, err := decode(again[4:])
		require.NoError(t, err)
		require.Equal(t, c.Code, c2.Code)
		require.Equal(t, c.Opaque, c2.Opaque)
		require.Equal(t, len(c.Body), len(c2.Body))
	})
}

func FuzzDecodeBatch(f *testing.F) {
	f.Add([]byte{0, 0, 0, 22, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		items, err := decodeBatch(b)
		if err == nil {
			require.NotEmpty(t, items)
		}
	})
}

// routeAddr asks s for a route and returns the answer's code and broker
// address.
func routeAddr(t *testing.T, s *Server) (int16, string) {
	nc, r := dial(t, s)
	defer nc.Close()
	resp := call(t, nc, r, &command{Code: reqGetRouteByTopic, Opaque: 1, ExtFields: map[string]string{"topic": "orders"}})
	var route struct {
		BrokerDatas []struct {
			BrokerAddrs map[string]string `json:"brokerAddrs"`
		} `json:"brokerDatas"`
	}
	if resp.Code != codeSuccess {
		return resp.Code, ""
	}
	require.NoError(t, json.Unmarshal(resp.Body, &route))
	return resp.Code, route.BrokerDatas[0].BrokerAddrs["0"]
}

// Each node announces its RocketMQ address with its record, so a follower
// names the leader's in route answers, and the new leader's after a
// leader change, with no static list of addresses.
func TestFollowersNameTheLeader(t *testing.T) {
	servers := map[string]*Server{}
	var mu sync.Mutex
	c := txmqtest.NewCluster(t, 3, func(s txmqtest.Spec) (*broker.Broker, error) {
		lis, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		b, err := broker.Open(broker.Config{Raft: s.Raft, GRPCListener: s.API, Join: s.Join, Logger: txmqtest.Logger(), RocketMQAdvertise: lis.Addr().String()})
		if err != nil {
			lis.Close()
			return nil, err
		}
		srv, err := Serve(lis, Config{Broker: b, Logger: txmqtest.Logger()})
		if err != nil {
			b.Close()
			return nil, err
		}
		t.Cleanup(func() { srv.Close() })
		mu.Lock()
		servers[s.Raft.NodeID] = srv
		mu.Unlock()
		return b, nil
	})
	namesLeader := func(ids ...string) {
		leader := c.Leader().Node().ID()
		mu.Lock()
		want := servers[leader].Addr()
		mu.Unlock()
		txmqtest.CheckFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			for _, id := range ids {
				mu.Lock()
				s := servers[id]
				mu.Unlock()
				if code, addr := routeAddr(t, s); addr != want {
					return fmt.Errorf("%s answers %d %q, want the leader %s's %s", id, code, addr, leader, want)
				}
			}
			return nil
		})
	}
	namesLeader("n1", "n2", "n3")
	old := c.Leader().Node().ID()
	mu.Lock()
	servers[old].Close()
	mu.Unlock()
	c.Stop(old)
	var rest []string
	for _, id := range []string{"n1", "n2", "n3"} {
		if id != old {
			rest = append(rest, id)
		}
	}
	namesLeader(rest...)
}
