package txmq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/api/names"
)

func checkName(field, name string) error {
	if name == "" {
		return invalidf("%s is empty", field)
	}
	if !names.Valid(name) {
		return invalidf("%s %q is not a valid name: use %s", field, name, names.Rule)
	}
	return nil
}

// ProducerConfig configures a Producer. The zero value of every field but
// ProducerGroup has a usable default.
type ProducerConfig struct {
	// Addrs are broker gRPC addresses (host:port). Any node will do: a
	// follower names the leader and the producer moves there. Default
	// 127.0.0.1:7420.
	Addrs []string
	// ProducerGroup names the service the producer belongs to. Check-backs
	// for its half messages go to a live instance of this group. Required
	// for SendHalf, CommitTx, RollbackTx, SendInTransaction and Checker.
	ProducerGroup string
	// DialOptions are passed to grpc.NewClient after the transport
	// credentials TLS sets (plaintext without TLS), so they can replace
	// them.
	DialOptions []grpc.DialOption
	// Token is the bearer token of the principal (ConnConfig.Token).
	Token string
	// TLS secures the connections to the brokers (ConnConfig.TLS).
	TLS *tls.Config
	// Logger receives the producer's logs. Default slog.Default().
	Logger *slog.Logger
	// RetryTimeout bounds how long a call keeps retrying while the broker
	// is Unavailable (leader change, no quorum). Default 15 s.
	RetryTimeout time.Duration

	// Checker answers the broker's check-backs for the group's half
	// messages (see Checker for the rule it must follow). Optional; when
	// set, ProducerGroup is required, and the producer registers the
	// instance with the broker and heartbeats until Close. By default the
	// check-backs come over the producer's own session to the broker (the
	// stream that carries its writes), so the producer opens no port and
	// needs none reachable: it works behind NAT, in a container, from
	// another network. Set CallbackListen or CallbackAdvertise to serve
	// txmq.v1.TransactionChecker on a port the broker dials instead, or
	// CallbackURL to serve CheckHandler yourself. A broker whose sessions
	// carry no check-backs (an older one) gets the server on CallbackListen
	// (default 127.0.0.1:0).
	Checker Checker
	// InstanceID names this producer instance to the broker; it must be
	// unique in the group and match the rule for names. Default:
	// hostname-pid-random.
	InstanceID string
	// CallbackListen, when set, makes the producer serve check-backs on this
	// TCP address instead of its session, e.g. ":7430" (":0" for any free
	// port). A broker that is not on loopback refuses a loopback address
	// (127.0.0.1, ::1, localhost): it could not reach it.
	CallbackListen string
	// CallbackAdvertise is the host:port the broker dials to reach the
	// check-back server, when that differs from the listen address (NAT,
	// containers); setting it alone serves on 127.0.0.1:0. Default: the
	// bound listen address, with the host name in place of a wildcard IP.
	CallbackAdvertise string
	// CallbackURL, instead of the session or a server, has the broker POST
	// check-backs to this http:// or https:// URL, where the application
	// serves CheckHandler(Checker) itself.
	CallbackURL string

	// OnewayCommit makes Commit, CommitTx and the commit of
	// SendInTransaction return once the commit is sent, without waiting for
	// the broker to make it durable (RocketMQ's endTransactionOneway): a
	// transaction then costs one quorum write instead of two. The commit is
	// "accepted", not "durable": if it is lost (the broker fails before
	// writing it, the connection drops), the half message stays pending and
	// check-back commits it, which is why OnewayCommit needs a Checker. A
	// commit the broker refuses is logged by the broker, not returned.
	// Rollbacks are always acknowledged.
	OnewayCommit bool
}

// Producer sends plain messages and transactional (half) messages. It is
// safe for concurrent use.
type Producer struct {
	group        string
	instance     string
	retryTimeout time.Duration
	log          *slog.Logger
	conn         *Conn
	// pipe carries the writes; onewayCommit sends commits without waiting.
	pipe         *pipeline
	onewayCommit bool

	callback  *callback // nil without a Checker
	closeOnce sync.Once
}

// NewProducer is NewProducerContext without a context: with a Checker and
// no broker reachable, it waits RetryTimeout (15 s by default) before it
// returns. Programs that must start fast, or stop while starting, use
// NewProducerContext.
func NewProducer(cfg ProducerConfig) (*Producer, error) {
	return NewProducerContext(context.Background(), cfg)
}

// NewProducerContext checks cfg and returns a Producer. Without a Checker
// it does not connect: the first call does.
//
// With a Checker it registers the instance with the broker (on the
// producer's session, unless a check-back server or URL is configured, see
// ProducerConfig.Checker), waiting for the registration until ctx ends or
// RetryTimeout has passed, whichever comes first. If the broker cannot be
// reached by then, it still returns the producer, logs a warning and keeps
// registering in the background: a producer may start before the broker.
// When ctx is cancelled (not when its deadline passes) it stops, releases
// what it started and returns ctx's error. It fails when the server cannot
// listen, or when the broker refuses the registration as invalid
// (ErrInvalidArgument).
func NewProducerContext(ctx context.Context, cfg ProducerConfig) (*Producer, error) {
	if cfg.ProducerGroup != "" {
		if err := checkName("ProducerGroup", cfg.ProducerGroup); err != nil {
			return nil, err
		}
	}
	if cfg.RetryTimeout < 0 {
		return nil, invalidf("RetryTimeout %v is negative", cfg.RetryTimeout)
	}
	if cfg.RetryTimeout == 0 {
		cfg.RetryTimeout = defaultRetryTimeout
	}
	if cfg.OnewayCommit && cfg.Checker == nil {
		return nil, invalidf("OnewayCommit needs a Checker: a one-way commit that is lost is recovered by check-back")
	}
	if err := callbackConfig(&cfg); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With("component", "txmq-producer")
	if cfg.ProducerGroup != "" {
		logger = logger.With("group", cfg.ProducerGroup)
	}
	conn, err := Dial(ConnConfig{Addrs: cfg.Addrs, DialOptions: cfg.DialOptions, TLS: cfg.TLS, Token: cfg.Token, Logger: logger, RetryTimeout: cfg.RetryTimeout})
	if err != nil {
		return nil, err
	}
	p := &Producer{
		group:        cfg.ProducerGroup,
		instance:     cfg.InstanceID,
		retryTimeout: cfg.RetryTimeout,
		log:          logger,
		conn:         conn,
		pipe:         &pipeline{log: logger},
		onewayCommit: cfg.OnewayCommit,
	}
	if cfg.Checker != nil {
		p.callback, err = startCallback(ctx, cfg, conn, p.pipe, logger.With("instance", cfg.InstanceID))
		if err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	return p, nil
}

// InstanceID is the name this producer instance registers under.
func (p *Producer) InstanceID() string { return p.instance }

// CallbackAddr is where the broker sends check-backs to this instance: the
// advertised host:port of the check-back server, or CallbackURL. It is empty
// when they come over the producer's session (the default), and when the
// producer has no Checker.
func (p *Producer) CallbackAddr() string {
	if p.callback == nil {
		return ""
	}
	return p.callback.callbackAddr()
}

// Message is a message to send.
type Message struct {
	Topic string
	// Key is carried to consumers. On Send it is also the deduplication key
	// within the broker's dedup window, which makes retries safe.
	Key        string
	Properties map[string]string
	Body       []byte
	// OrderingKey, when set, orders the message among those of its topic
	// with the same ordering key: each consumer group gets them in commit
	// order, one at a time (the next is delivered once the previous one is
	// acked or dead-lettered). Messages without one are not ordered.
	OrderingKey string
}

func (m Message) check() error {
	if err := checkName("topic", m.Topic); err != nil {
		return err
	}
	if len(m.Body) == 0 {
		return invalidf("message body is empty")
	}
	return nil
}

// SendResult is the broker's answer to Send.
type SendResult struct {
	// MessageID is stable for the message's whole life.
	MessageID string
	// Sequence is the message's position in its topic.
	Sequence uint64
	// Duplicate is true when the key was seen within the dedup window;
	// MessageID and Sequence are then the first message's. A repeat of the
	// key with another body fails with ErrConflict instead.
	Duplicate bool
}

// Send appends a committed message to msg.Topic. It returns once the message
// is on the replicated log of a majority.
//
// Send retries while the broker is Unavailable, but only when a repeat
// cannot store the message twice: always when msg.Key is set (the broker
// deduplicates on it), and otherwise only when the broker certainly did not
// accept the request (a follower refused it, or no connection could be made).
// Without a key, an Unavailable error may hide a message that was stored.
func (p *Producer) Send(ctx context.Context, msg Message) (SendResult, error) {
	if err := msg.check(); err != nil {
		return SendResult{}, err
	}
	req := &txmqv1.SendRequest{Topic: msg.Topic, Key: msg.Key, Properties: msg.Properties, Body: msg.Body, OrderingKey: msg.OrderingKey}
	r, err := p.write(ctx, msg.Key != "", &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_Send{Send: req}})
	if err != nil {
		return SendResult{}, err
	}
	resp := r.GetSend()
	// Typed attributes: a disabled debug line then costs no allocation.
	p.log.LogAttrs(ctx, slog.LevelDebug, "sent", slog.String("topic", msg.Topic), slog.String("msg_id", resp.GetMessageId()),
		slog.Uint64("sequence", resp.GetSequence()), slog.Bool("duplicate", resp.GetDuplicate()))
	return SendResult{MessageID: resp.GetMessageId(), Sequence: resp.GetSequence(), Duplicate: resp.GetDuplicate()}, nil
}

type halfOptions struct {
	checkAfter time.Duration
}

// HalfOption adjusts a half message.
type HalfOption func(*halfOptions)

// WithCheckAfter sets when the broker first checks back on the half message
// if it is still unresolved; 1 s to 1 h, default 6 s. Set it above the
// longest time the local transaction can take, or the check may find no
// outcome yet and have to ask again later.
func WithCheckAfter(d time.Duration) HalfOption {
	return func(o *halfOptions) { o.checkAfter = d }
}

// SendHalf stores msg as a half message of the producer's group under txID:
// durable, but invisible to consumers until it is committed. Sending the same
// txID again returns the same message ID, so SendHalf is always retried while
// the broker is Unavailable; sending it with another topic or body fails with
// ErrConflict, naming the first message.
func (p *Producer) SendHalf(ctx context.Context, txID string, msg Message, opts ...HalfOption) (messageID string, err error) {
	resp, err := p.sendHalf(ctx, txID, msg, opts)
	if err != nil {
		return "", err
	}
	return resp.GetMessageId(), nil
}

func (p *Producer) sendHalf(ctx context.Context, txID string, msg Message, opts []HalfOption) (*txmqv1.SendHalfResponse, error) {
	if err := p.checkTx(txID); err != nil {
		return nil, err
	}
	if err := msg.check(); err != nil {
		return nil, err
	}
	var o halfOptions
	for _, opt := range opts {
		opt(&o)
	}
	req := &txmqv1.SendHalfRequest{
		Topic:         msg.Topic,
		ProducerGroup: p.group,
		TransactionId: txID,
		Key:           msg.Key,
		Properties:    msg.Properties,
		Body:          msg.Body,
		OrderingKey:   msg.OrderingKey,
	}
	if o.checkAfter != 0 {
		if o.checkAfter < time.Second || o.checkAfter > time.Hour {
			return nil, invalidf("check-after %v is outside 1s to 1h", o.checkAfter)
		}
		req.CheckAfter = durationpb.New(o.checkAfter)
	}
	r, err := p.write(ctx, true, &txmqv1.SessionRequest{Kind: &txmqv1.SessionRequest_SendHalf{SendHalf: req}})
	if err != nil {
		return nil, err
	}
	resp := r.GetSendHalf()
	p.log.LogAttrs(ctx, slog.LevelDebug, "half message stored", slog.String("topic", msg.Topic), slog.String("tx_id", txID),
		slog.String("msg_id", resp.GetMessageId()), slog.Bool("duplicate", resp.GetDuplicate()), slog.Any("state", resp.GetState()))
	return resp, nil
}

func (p *Producer) checkTx(txID string) error {
	if p.group == "" {
		return invalidf("ProducerGroup is not set; transactions need one")
	}
	if txID == "" {
		return invalidf("transaction ID is empty")
	}
	return nil
}

// Commit makes the half message deliverable. Committing a committed message
// succeeds; committing a rolled-back or expired one fails with ErrConflict.
func (p *Producer) Commit(ctx context.Context, messageID string) error {
	return p.endByID(ctx, messageID, txmqv1.Resolution_RESOLUTION_COMMIT)
}

// Rollback discards the half message. Rolling back a rolled-back message
// succeeds; rolling back a committed or expired one fails with ErrConflict.
func (p *Producer) Rollback(ctx context.Context, messageID string) error {
	return p.endByID(ctx, messageID, txmqv1.Resolution_RESOLUTION_ROLLBACK)
}

// CommitTx is Commit for the half message the producer's group sent under
// txID.
func (p *Producer) CommitTx(ctx context.Context, txID string) error {
	return p.endByTx(ctx, txID, txmqv1.Resolution_RESOLUTION_COMMIT)
}

// RollbackTx is Rollback for the half message the producer's group sent
// under txID.
func (p *Producer) RollbackTx(ctx context.Context, txID string) error {
	return p.endByTx(ctx, txID, txmqv1.Resolution_RESOLUTION_ROLLBACK)
}

func (p *Producer) endByID(ctx context.Context, messageID string, res txmqv1.Resolution) error {
	if messageID == "" {
		return invalidf("message ID is empty")
	}
	return p.end(ctx, &txmqv1.EndTransactionRequest{
		Target:     &txmqv1.EndTransactionRequest_MessageId{MessageId: messageID},
		Resolution: res,
	})
}

func (p *Producer) endByTx(ctx context.Context, txID string, res txmqv1.Resolution) error {
	if err := p.checkTx(txID); err != nil {
		return err
	}
	return p.end(ctx, &txmqv1.EndTransactionRequest{
		Target: &txmqv1.EndTransactionRequest_Transaction{Transaction: &txmqv1.TransactionRef{
			ProducerGroup: p.group,
			TransactionId: txID,
		}},
		Resolution: res,
	})
}

// end resolves a half message. The first resolution wins and repeating it
// succeeds, so it is always retried while the broker is Unavailable. With
// OnewayCommit a commit returns once it is sent.
func (p *Producer) end(ctx context.Context, req *txmqv1.EndTransactionRequest) error {
	oneway := p.onewayCommit && req.Resolution == txmqv1.Resolution_RESOLUTION_COMMIT
	r, err := p.write(ctx, true, &txmqv1.SessionRequest{Oneway: oneway, Kind: &txmqv1.SessionRequest_EndTransaction{EndTransaction: req}})
	if err != nil {
		return err
	}
	if oneway {
		p.log.LogAttrs(ctx, slog.LevelDebug, "commit sent one-way", slog.Any("target", req.GetTarget()))
		return nil
	}
	resp := r.GetEndTransaction()
	p.log.LogAttrs(ctx, slog.LevelDebug, "half message resolved", slog.String("msg_id", resp.GetMessageId()),
		slog.Any("state", resp.GetState()), slog.Uint64("sequence", resp.GetSequence()))
	return nil
}

// SendInTransaction sends msg as a half message under txID, runs localTx,
// and commits the message if localTx succeeded or rolls it back if it failed.
// messageID is set whenever the half message was stored.
//
// localTx must record its outcome in the same database, and in the same
// local transaction, as its business writes: typically a row keyed by txID
// in a transaction-log table. The producer group's Checker (see
// ProducerConfig.Checker) answers the broker from that table, so if this
// process dies between localTx and Commit the broker still learns the truth.
// Never record the outcome in a cache or anywhere that can disagree with the
// database.
//
// The outcomes:
//   - SendHalf fails: its error is returned and localTx does not run.
//   - txID was already used and its message is still pending (a retry
//     after a crash before Commit): localTx runs again. It must treat an
//     outcome already recorded under txID as success, not as an error, or
//     the rollback that follows would contradict its committed first run.
//   - txID was already used and its message committed (a retry of a call
//     that succeeded): messageID and nil, localTx does not run.
//   - txID was already used and its message rolled back or expired: an error
//     matching ErrConflict, localTx does not run.
//   - localTx fails: the message is rolled back and the returned error wraps
//     localTx's error. If the rollback itself fails, it is logged and the
//     message stays pending until check-back rolls it back.
//   - localTx fails with an error matching ErrOutcomeUnknown (its database
//     COMMIT returned an error, so the change may or may not have
//     committed): the message is left pending, neither committed nor rolled
//     back, and the returned error wraps localTx's. Check-back then answers
//     from the database. Rolling back here would lose the message of a
//     transaction that did commit.
//   - Commit fails after its retries with the message still pending: the
//     error wraps both ErrCommitPending and the cause. The local transaction
//     is committed and check-back will commit the message, so callers may
//     treat errors.Is(err, ErrCommitPending) as done.
//   - Commit fails because the broker already resolved the message the
//     other way, or no longer knows it (ErrConflict, ErrNotFound): that error
//     is returned, without ErrCommitPending, as the message will not be
//     delivered.
//
// ctx bounds every step; a commit or rollback cut short by ctx is left to
// check-back like any other failed one.
func (p *Producer) SendInTransaction(ctx context.Context, txID string, msg Message, localTx func(ctx context.Context) error, opts ...HalfOption) (messageID string, err error) {
	if localTx == nil {
		return "", invalidf("local transaction func is nil")
	}
	half, err := p.sendHalf(ctx, txID, msg, opts)
	if err != nil {
		return "", err
	}
	id := half.GetMessageId()
	// Made only when there is something to log (see session.logFor).
	log := func() *slog.Logger { return p.log.With("tx_id", txID, "msg_id", id) }
	switch half.GetState() {
	case txmqv1.HalfState_HALF_STATE_COMMITTED:
		log().Info("transaction already committed; local transaction not run again")
		return id, nil
	case txmqv1.HalfState_HALF_STATE_ROLLED_BACK, txmqv1.HalfState_HALF_STATE_EXPIRED:
		return id, fmt.Errorf("%w: transaction %s was already used and its message %s is %s", ErrConflict, txID, id, half.GetState())
	}

	if txErr := localTx(ctx); txErr != nil {
		if errors.Is(txErr, ErrOutcomeUnknown) {
			log().Warn("local transaction outcome unknown; check-back will resolve the message", "err", txErr)
			return id, fmt.Errorf("txmq: local transaction %s: message %s left to check-back: %w", txID, id, txErr)
		}
		if rbErr := p.Rollback(ctx, id); rbErr != nil {
			log().Warn("rollback after local transaction failure failed; check-back will roll it back", "err", rbErr, "local_err", txErr)
			return id, fmt.Errorf("txmq: local transaction %s failed, message %s left to check-back (rollback: %v): %w", txID, id, rbErr, txErr)
		}
		return id, fmt.Errorf("txmq: local transaction %s failed, message %s rolled back: %w", txID, id, txErr)
	}

	if err := p.Commit(ctx, id); err != nil {
		if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
			log().Error("local transaction committed but the broker refused the commit", "err", err)
			return id, err
		}
		log().Warn("commit failed; check-back will commit the message", "err", err)
		return id, fmt.Errorf("%w: message %s of transaction %s: %w", ErrCommitPending, id, txID, err)
	}
	return id, nil
}

// Close stops the heartbeats and the check-backs (those in progress get a
// few seconds to finish), then closes the producer's session and
// connections. Calls after Close fail with ErrClosed. The broker forgets an
// instance registered on the session as the session ends, and one with a
// check-back server or URL when its lease runs out, and sends check-backs to
// other instances of the group.
func (p *Producer) Close() error {
	p.closeOnce.Do(func() {
		if p.callback != nil {
			p.callback.close()
		}
	})
	p.pipe.close()
	return p.conn.Close()
}
