// Package txmq is the Go client of the txmq broker: a Producer for plain and
// transactional (half) messages, and a Consumer that receives committed
// messages for a consumer group.
//
// # Producing
//
// A plain message is committed as soon as Send returns:
//
//	p, err := txmq.NewProducer(txmq.ProducerConfig{
//		Addrs:         []string{"broker-1:7420", "broker-2:7420", "broker-3:7420"},
//		ProducerGroup: "orders",
//	})
//	if err != nil { ... }
//	defer p.Close()
//	res, err := p.Send(ctx, txmq.Message{Topic: "order-events", Key: "order-42", Body: body})
//
// A transactional message is stored as a half message, invisible to
// consumers, and committed only if the local transaction commits:
//
//	id, err := p.SendInTransaction(ctx, "order-42:paid", msg, func(ctx context.Context) error {
//		// One database transaction: the business writes and a row for
//		// "order-42:paid" in the transaction-log table.
//		return markPaid(ctx, db, 42, "order-42:paid")
//	})
//	if err != nil && !errors.Is(err, txmq.ErrCommitPending) { ... }
//
// If the producer dies before it commits, the broker asks the producer group
// (check-back) and the answer must come from that transaction-log table.
// See Producer.SendInTransaction.
//
// # Check-backs
//
// A producer that sends half messages answers check-backs with a Checker:
//
//	p, err := txmq.NewProducer(txmq.ProducerConfig{
//		Addrs:         []string{"broker-1:7420", "broker-2:7420", "broker-3:7420"},
//		ProducerGroup: "orders",
//		Checker:       checkOrder, // func(ctx, txmq.HalfMessage) (txmq.Resolution, error)
//	})
//
// NewProducer then registers the instance on its session to the broker's
// leader (the stream that carries its writes) and heartbeats until Close;
// the broker sends each check-back to one live instance of the group, down
// that stream, and the answer goes back up it. The producer opens no port,
// so it works from behind NAT or in a container. To have the broker dial
// the producer instead, set CallbackListen (and CallbackAdvertise, what the
// broker dials): NewProducer then serves txmq.v1.TransactionChecker there.
// A producer behind a plain web server can serve CheckHandler instead and
// set CallbackURL.
//
// The rule, learned the hard way: the checker answers from the same database
// the local transaction wrote, reading what that transaction committed, and
// from nothing else: not a cache, not a Redis flag, not a read replica that
// may lag, and never a flag written before the local commit. An order
// service once set a "paid" flag in a cache right after sending the half
// message; the local transaction then failed and rolled back, the flag
// stayed, the check-back answered COMMIT, and a points service credited
// points for an order that did not exist. The transaction-log table makes
// the answer exact: the local transaction inserts a row (tx_id PRIMARY KEY,
// status) in the same database transaction as its business change, and the
// checker answers Commit if the row is there, Rollback if it is not and the
// half message is older than the longest the local transaction can take,
// and Unknown otherwise. See Checker and ExampleChecker.
//
// TxLog is that pattern, done: TxLog.Execute runs SendHalf, one database
// transaction with the log row and the caller's business function, the
// database COMMIT and the broker Commit, and TxLog.Check is the Checker
// that reads the table. A local transaction whose COMMIT failed with its
// outcome unknown returns ErrOutcomeUnknown, which leaves the half message
// for check-back to resolve from the table. The packages outbox (the local
// message table and its relay) and reconcile (compensation of what slipped
// through) complete the picture; docs/consistency.md compares the schemes.
//
// # Consuming
//
//	c, err := txmq.NewConsumer(txmq.ConsumerConfig{
//		Addrs: []string{"broker-1:7420"}, Topic: "order-events", Group: "billing",
//		Concurrency: 8, // handlers in parallel
//		Prefetch:    16, // deliveries the broker pushes without an ack
//	})
//	if err != nil { ... }
//	defer c.Close()
//	err = c.Run(ctx, func(ctx context.Context, d *txmq.Delivery) error {
//		return bill(ctx, d.MessageID, d.Body) // nil acks; an error nacks
//	})
//
// A handler's error nacks the delivery with the error's text, and the broker
// redelivers it after the group's backoff, with Attempt one higher and the
// text in LastError; RetryAfter(err, delay) picks the delay. While a handler
// runs, the consumer extends the delivery's ack deadline, up to
// ConsumerConfig.MaxExtension.
//
// Delivery is at least once: deduplicate on Delivery.MessageID. ProcessOnce
// does it for handlers that write to a SQL database (through a *sql.DB or a
// *sql.Conn; ProcessOnceInTx inside the caller's transaction), with a
// consumer_record table written in the same transaction as the change.
//
// # Errors and retries
//
// Broker refusals match the sentinels ErrInvalidArgument, ErrNotFound,
// ErrConflict, ErrUnavailable, ErrResourceExhausted, ErrUnauthenticated and
// ErrPermissionDenied with errors.Is, and their text carries the broker's
// message. Any broker node can be given in Addrs: calls that reach a follower
// are redirected to the leader, and Unavailable answers are retried for up to
// RetryTimeout when a repeat is safe (see Producer.Send).
//
// # Calling the services directly
//
// Conn, made by Dial, is the connection Producer and Consumer use: one gRPC
// connection per node, leader following and the retry rule above. Programs
// that call the broker's gRPC services themselves (brokerctl does) send each
// request through Conn.Invoke, saying whether it is safe to repeat, or
// through InvokeAny (any node that answers) and InvokeOn (one given node).
// See ExampleDial.
package txmq
