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
// # Consuming
//
//	c, err := txmq.NewConsumer(txmq.ConsumerConfig{
//		Addrs: []string{"broker-1:7420"}, Topic: "order-events", Group: "billing", Concurrency: 8,
//	})
//	if err != nil { ... }
//	defer c.Close()
//	err = c.Run(ctx, func(ctx context.Context, d *txmq.Delivery) error {
//		return bill(ctx, d.MessageID, d.Body) // nil acks; an error means "redeliver"
//	})
//
// Delivery is at least once: deduplicate on Delivery.MessageID.
//
// # Errors and retries
//
// Broker refusals match the sentinels ErrInvalidArgument, ErrNotFound,
// ErrConflict, ErrUnavailable, ErrResourceExhausted, ErrUnauthenticated and
// ErrPermissionDenied with errors.Is, and their text carries the broker's
// message. Any broker node can be given in Addrs: calls that reach a follower
// are redirected to the leader, and Unavailable answers are retried for up to
// RetryTimeout when a repeat is safe (see Producer.Send).
package txmq
