package rocketmq

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Response codes (RocketMQ's ResponseCode).
const (
	codeSuccess              = 0
	codeSystemError          = 1
	codeNotSupported         = 3 // REQUEST_CODE_NOT_SUPPORTED
	codeServiceUnavailable   = 14
	codeTopicNotExist        = 17
	codePullNotFound         = 19
	codePullRetryImmediately = 20
	codeQueryNotFound        = 22
	codeMessageIllegal       = 13
	codeNoPermission         = 16
)

// conn is one client connection. Requests are handled concurrently (a
// PULL_MESSAGE long-polls); answers and broker-initiated requests go
// through one writer, whose queue is bounded: a client that stops reading
// is disconnected, and the broker never blocks on it.
type conn struct {
	s      *Server
	nc     net.Conn
	peer   string
	out    chan []byte
	done   chan struct{}
	once   sync.Once
	opaque atomic.Int32

	mu sync.Mutex
	// producers: producer groups registered for check-backs on this
	// connection, by group; the value is the instance ID.
	producers map[string]string
	// checks waiting for their END_TRANSACTION, by transaction ID.
	checks map[string]chan int
}

func newConn(s *Server, nc net.Conn) *conn {
	return &conn{
		s: s, nc: nc, peer: nc.RemoteAddr().String(),
		out: make(chan []byte, outQueue), done: make(chan struct{}),
		producers: map[string]string{}, checks: map[string]chan int{},
	}
}

func (c *conn) close() {
	c.once.Do(func() {
		close(c.done)
		c.nc.Close()
	})
}

// run serves the connection until it ends.
func (c *conn) run() {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.write() }()
	go func() { defer wg.Done(); c.renew() }()
	c.read()
	c.close()
	wg.Wait()
	c.endSessions()
}

func (c *conn) read() {
	r := bufio.NewReaderSize(c.nc, 64<<10)
	slots := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		frame, err := readFrame(r)
		if err != nil {
			if errors.Is(err, ErrFrame) {
				c.s.log.Warn("closing a connection: bad frame", "peer", c.peer, "err", err)
			}
			return
		}
		cmd, err := decode(frame)
		if err != nil {
			c.s.log.Warn("closing a connection: bad frame", "peer", c.peer, "err", err)
			return
		}
		if cmd.response() {
			// Clients answer CHECK_TRANSACTION_STATE with END_TRANSACTION,
			// never with a response; nothing waits for one.
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-c.done:
			return
		}
		// An offset commit counts as received now, before its turn
		// (offsetwait.go).
		written := func() {}
		if cmd.Code == reqUpdateConsumerOff {
			written = c.s.offsets.begin(cmd.field("consumerGroup"), cmd.field("topic"))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			defer written()
			resp := c.s.handle(c, cmd)
			if resp == nil || cmd.oneway() {
				return
			}
			resp.Opaque = cmd.Opaque
			resp.Flag |= flagResponse
			c.send(resp)
		}()
	}
}

// send queues a frame; a full queue means the client is not reading.
func (c *conn) send(cmd *command) bool {
	cmd.Language = "GO"
	frame, err := encode(cmd)
	if err != nil {
		c.s.log.Error("cannot encode a remoting frame", "peer", c.peer, "code", cmd.Code, "err", err)
		return false
	}
	select {
	case c.out <- frame:
		return true
	case <-c.done:
		return false
	default:
		c.s.log.Warn("closing a connection: the client does not read its answers", "peer", c.peer)
		c.close()
		return false
	}
}

func (c *conn) write() {
	for {
		select {
		case f := <-c.out:
			c.nc.SetWriteDeadline(time.Now().Add(c.s.cfg.WriteTimeout))
			if _, err := c.nc.Write(f); err != nil {
				c.close()
				return
			}
		case <-c.done:
			return
		}
	}
}

// renew keeps the connection's producer registrations alive while it is
// open: a RocketMQ client heartbeats every 30 s, txmq's lease is shorter,
// and an open connection is what says the producer is alive.
func (c *conn) renew() {
	t := time.NewTicker(c.s.cfg.Broker.HeartbeatInterval())
	defer t.Stop()
	for {
		select {
		case <-t.C:
			c.mu.Lock()
			groups := make(map[string]string, len(c.producers))
			for g, id := range c.producers {
				groups[g] = id
			}
			c.mu.Unlock()
			for g, id := range groups {
				if c.s.cfg.Broker.HeartbeatSession(g, id, c) != nil {
					c.registerProducer(g)
				}
			}
		case <-c.done:
			return
		}
	}
}

// registerProducer makes the connection a check-back endpoint of group
// (again, after a leader change), once per group while it holds.
func (c *conn) registerProducer(group string) {
	id := "rocketmq:" + c.peer
	if err := c.s.cfg.Broker.RegisterSession(group, id, c); err != nil {
		c.s.log.Debug("producer connection not registered", "group", group, "peer", c.peer, "err", err)
		return
	}
	c.mu.Lock()
	c.producers[group] = id
	c.mu.Unlock()
}

func (c *conn) hasProducer(group string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.producers[group]
	return ok
}

// endSessions forgets the connection's registrations and fails its
// waiting check-backs.
func (c *conn) endSessions() {
	c.mu.Lock()
	groups := c.producers
	c.producers = map[string]string{}
	c.mu.Unlock()
	for g, id := range groups {
		c.s.cfg.Broker.UnregisterSession(g, id, c)
	}
}

// Peer implements checkback.Session.
func (c *conn) Peer() string { return c.peer }

// request sends a broker-initiated request (no answer is read).
func (c *conn) request(code int16, ext map[string]string, body []byte) error {
	cmd := &command{Code: code, Version: version, Opaque: c.opaque.Add(1), ExtFields: ext, Body: body}
	if !c.send(cmd) {
		return fmt.Errorf("the connection of %s is closed or not reading", c.peer)
	}
	return nil
}

// awaitCheck registers a waiter for the END_TRANSACTION answering a
// check-back of txID.
func (c *conn) awaitCheck(txID string) (chan int, func()) {
	ch := make(chan int, 1)
	c.mu.Lock()
	c.checks[txID] = ch
	c.mu.Unlock()
	return ch, func() {
		c.mu.Lock()
		if c.checks[txID] == ch {
			delete(c.checks, txID)
		}
		c.mu.Unlock()
	}
}

// answerCheck hands a check-back's answer to its waiter, if one waits.
func (c *conn) answerCheck(txID string, commitOrRollback int) bool {
	c.mu.Lock()
	ch, ok := c.checks[txID]
	delete(c.checks, txID)
	c.mu.Unlock()
	if ok {
		ch <- commitOrRollback
	}
	return ok
}

// wait blocks until ch is closed or the time due comes (true), or until
// ctx or the connection ends (false).
func (c *conn) wait(ctx context.Context, ch <-chan struct{}, due time.Time) bool {
	var at <-chan time.Time
	if !due.IsZero() {
		t := time.NewTimer(time.Until(due))
		defer t.Stop()
		at = t.C
	}
	select {
	case <-ch:
		return true
	case <-at:
		return true
	case <-ctx.Done():
	case <-c.done:
	}
	return false
}
