package main

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"time"

	txmq "github.com/txmq/txmq/client/go"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
)

const (
	backlogTopic = "bench-backlog"
	backlogGroup = "bench"
)

// seedID is a message ID in the broker's shape (leader clock in ms, then 8
// more bytes, hex), with a counter for the random part so that seeding
// appends to bbolt's B+trees instead of splitting pages all over.
func seedID(ms int64, kind byte, i int) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(ms))
	binary.BigEndian.PutUint64(b[8:], uint64(i))
	b[8] = kind
	return hex.EncodeToString(b[:])
}

// seed writes a store with pending half messages (first check due in an
// hour) and committed messages directly through halfstore, in large bbolt
// transactions: creating millions of them through the API would take
// hours. Every node gets a copy of it before it starts; Raft then starts
// from an empty log on top of that state.
func seed(path string, pending, committed, size int) error {
	s, err := halfstore.Open(path)
	if err != nil {
		return err
	}
	now := time.Now()
	ms, ns := now.UnixMilli(), now.UnixNano()
	body := make([]byte, size)
	const batch = 50_000
	for from := 0; from < pending; from += batch {
		err := s.Update(func(tx *halfstore.Tx) error {
			for i := from; i < min(from+batch, pending); i++ {
				h := &storepb.Half{Id: seedID(ms, 'h', i), Topic: backlogTopic, ProducerGroup: backlogGroup,
					TransactionId: fmt.Sprintf("seed-%010d", i), Body: body, CreatedAt: ns, CheckAfter: int64(time.Hour)}
				if _, _, err := tx.PutHalf(h, true); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			s.Close()
			return fmt.Errorf("seed pending: %w", err)
		}
	}
	for from := 0; from < committed; from += batch {
		err := s.Update(func(tx *halfstore.Tx) error {
			for i := from; i < min(from+batch, committed); i++ {
				if _, _, err := tx.Send(backlogTopic, &storepb.Message{Id: seedID(ms, 'm', i), Body: body}, true, 0, ns); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			s.Close()
			return fmt.Errorf("seed committed: %w", err)
		}
	}
	return s.Close()
}

// backlog runs the tx workload twice on fresh clusters: on an empty one,
// then on one whose store holds --backlog-pending pending half messages and
// --backlog-committed committed messages of the same topic and producer
// group. The result is the second run, with the first one's p99 for
// comparison.
func backlog(ctx context.Context, o *options, spec clusterSpec, producers int, runID string) (*result, error) {
	empty, err := runOn(ctx, o, spec, func(e *env) (*result, error) {
		return closedLoop(ctx, e, "tx", producers, backlogTopic, txmq.StartLatest)
	}, runID+"-empty")
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(o.log, "# backlog: empty cluster: %.0f tx/s, txn p99 %.3f ms\n", empty.Throughput, us(summaryOf(empty, "txn").P99)/1e3)

	spec.seed = filepath.Join(spec.dir, "seed-fsm.db")
	t0 := time.Now()
	if err := seed(spec.seed, o.backlogPending, o.backlogCommitted, o.size); err != nil {
		return nil, err
	}
	seedTime := time.Since(t0)
	fmt.Fprintf(o.log, "# backlog: seeded %d pending and %d committed messages into fsm.db directly through halfstore in %s\n",
		o.backlogPending, o.backlogCommitted, seedTime.Round(time.Millisecond))
	res, err := runOn(ctx, o, spec, func(e *env) (*result, error) {
		return closedLoop(ctx, e, "tx", producers, backlogTopic, txmq.StartLatest)
	}, runID)
	if err != nil {
		return nil, err
	}
	res.Workload = "backlog"
	res.extra("backlog_pending", "pending half messages seeded", float64(o.backlogPending))
	res.extra("backlog_committed", "committed messages seeded", float64(o.backlogCommitted))
	res.extra("seed_s", "seconds to seed the store", seedTime.Seconds())
	res.extra("empty_throughput_per_s", "tx/s on the empty cluster", empty.Throughput)
	emptyP99 := summaryOf(empty, "txn").P99
	res.extra("empty_txn_p99_us", "txn p99 on the empty cluster (µs)", us(emptyP99))
	if emptyP99 > 0 {
		res.extra("txn_p99_vs_empty", "txn p99 with the backlog / empty", float64(summaryOf(res, "txn").P99)/float64(emptyP99))
	}
	res.Notes = append(res.Notes, "the backlog was written into fsm.db through package halfstore before the brokers started, not through the API")
	return res, nil
}

func summaryOf(r *result, key string) summary {
	s, _ := r.latency(key)
	return s
}
