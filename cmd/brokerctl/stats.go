package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// clearScreen moves the cursor home and clears a terminal (ANSI).
const clearScreen = "\033[H\033[2J"

func runStats(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) error {
	w := addWatchFlags(fs, 2*time.Second, "time between the two snapshots that rates are computed from, and between frames")
	if _, err := c.start(fs, args); err != nil {
		return err
	}
	if err := w.check(c, fs); err != nil {
		return err
	}
	get := func() (*txmqv1.GetStatsResponse, error) {
		return adminCall(ctx, c, toLeader, txmqv1.AdminServiceClient.GetStats, &txmqv1.GetStatsRequest{})
	}
	prev, err := get()
	if err != nil {
		return err
	}
	// Rates need a second snapshot: the first frame comes an interval
	// after the first one.
	if !sleep(ctx, *w.interval) {
		if *w.on {
			// Interrupting is how --watch ends.
			return nil
		}
		return ctx.Err()
	}
	return c.repeat(ctx, w, func() error {
		cur, err := get()
		if err != nil {
			return err
		}
		defer func() { prev = cur }()
		if c.jsonOutput() {
			return c.printJSON(newStatsJSON(prev, cur))
		}
		return printStats(c.stdout, prev, cur)
	})
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// rater turns two snapshots' counters into rates per second. Counters
// start again at zero on a new leader: a rate across a leader change, or
// across a counter that went down, is unknown (nil).
type rater struct {
	seconds float64
	same    bool
}

func newRater(prev, cur *txmqv1.GetStatsResponse) rater {
	d := cur.GetTakenAt().AsTime().Sub(prev.GetTakenAt().AsTime()).Seconds()
	return rater{seconds: d, same: d > 0 && prev.GetNodeId() == cur.GetNodeId() && prev.GetTerm() == cur.GetTerm()}
}

func (r rater) rate(prev, cur uint64) *float64 {
	if !r.same || cur < prev {
		return nil
	}
	v := float64(cur-prev) / r.seconds
	return &v
}

func rateCell(v *float64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f", *v)
}

// The previous snapshot's entries, by name.
func prevTopic(s *txmqv1.GetStatsResponse, topic string) *txmqv1.TopicStats {
	for _, t := range s.GetTopics() {
		if t.GetTopic() == topic {
			return t
		}
	}
	return &txmqv1.TopicStats{Topic: topic}
}

func prevProducer(s *txmqv1.GetStatsResponse, group string) *txmqv1.ProducerGroupStats {
	for _, p := range s.GetProducerGroups() {
		if p.GetProducerGroup() == group {
			return p
		}
	}
	return &txmqv1.ProducerGroupStats{ProducerGroup: group}
}

func prevConsumer(s *txmqv1.GetStatsResponse, topic, group string) *txmqv1.ConsumerGroupStats {
	for _, g := range s.GetConsumerGroups() {
		if g.GetTopic() == topic && g.GetConsumerGroup() == group {
			return g
		}
	}
	return &txmqv1.ConsumerGroupStats{Topic: topic, ConsumerGroup: group}
}

// printStats prints one frame: the leader, then topics, producer groups
// and consumer groups, each with the rates since the previous snapshot.
func printStats(w io.Writer, prev, cur *txmqv1.GetStatsResponse) error {
	r := newRater(prev, cur)
	fmt.Fprintf(w, "leader %s  term %d  commit %d  applied %d  at %s  rates per second over %s\n\n",
		cur.GetNodeId(), cur.GetTerm(), cur.GetCommitIndex(), cur.GetAppliedIndex(), tableTime(cur.GetTakenAt()),
		time.Duration(r.seconds*float64(time.Second)).Round(time.Millisecond))
	tw := newTable(w)
	fmt.Fprintln(tw, "TOPIC\tCOMMITTED\tCOMMIT/S")
	for _, t := range cur.GetTopics() {
		p := prevTopic(prev, t.GetTopic())
		fmt.Fprintf(tw, "%s\t%d\t%s\n", t.GetTopic(), t.GetCommitted(), rateCell(r.rate(p.GetCommitted(), t.GetCommitted())))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PRODUCER-GROUP\tPENDING\tOLDEST\tEXPIRED\tINSTANCES\tCOMMIT/S\tROLLBACK/S\tEXPIRE/S\tCHECK/S\tCHECK-ERR/S")
	for _, g := range cur.GetProducerGroups() {
		p := prevProducer(prev, g.GetProducerGroup())
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", g.GetProducerGroup(), g.GetPending(),
			lagAge(g.GetPending(), g.GetOldestPendingAge()), g.GetExpired(), g.GetInstances(),
			rateCell(r.rate(p.GetCommittedTotal(), g.GetCommittedTotal())),
			rateCell(r.rate(p.GetRolledBackTotal(), g.GetRolledBackTotal())),
			rateCell(r.rate(p.GetExpiredTotal(), g.GetExpiredTotal())),
			rateCell(r.rate(p.GetChecksTotal(), g.GetChecksTotal())),
			rateCell(r.rate(p.GetCheckErrorsTotal(), g.GetCheckErrorsTotal())))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "TOPIC\tCONSUMER-GROUP\tLAG\tLAG-AGE\tIN-FLIGHT\tSUBSCRIBERS\tRETRYING\tDLQ\tDELIVER/S\tACK/S\tREDELIVER/S\tDLQ/S")
	for _, g := range cur.GetConsumerGroups() {
		p := prevConsumer(prev, g.GetTopic(), g.GetConsumerGroup())
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\n", g.GetTopic(), g.GetConsumerGroup(), g.GetLag(),
			lagAge(g.GetLag(), g.GetLagAge()), g.GetInFlight(), g.GetSubscribers(), g.GetRetrying(), g.GetDeadLetters(),
			rateCell(r.rate(p.GetDeliveredTotal(), g.GetDeliveredTotal())),
			rateCell(r.rate(p.GetAckedTotal(), g.GetAckedTotal())),
			rateCell(r.rate(p.GetRedeliveredTotal(), g.GetRedeliveredTotal())),
			rateCell(r.rate(p.GetDeadLetteredTotal(), g.GetDeadLetteredTotal())))
	}
	return tw.Flush()
}

// statsJSON is one frame of -o json: the current snapshot's figures, with
// rates per second since the previous one (absent when unknown).
type statsJSON struct {
	TakenAt        string              `json:"taken_at"`
	Leader         string              `json:"leader"`
	Term           uint64              `json:"term"`
	CommitIndex    uint64              `json:"commit_index"`
	AppliedIndex   uint64              `json:"applied_index"`
	IntervalS      float64             `json:"interval_seconds"`
	Topics         []topicStatsJSON    `json:"topics"`
	ProducerGroups []producerStatsJSON `json:"producer_groups"`
	ConsumerGroups []consumerStatsJSON `json:"consumer_groups"`
}

type topicStatsJSON struct {
	Topic      string   `json:"topic"`
	Committed  uint64   `json:"committed"`
	CommitRate *float64 `json:"commit_rate,omitempty"`
}

type producerStatsJSON struct {
	ProducerGroup    string   `json:"producer_group"`
	Pending          uint64   `json:"pending"`
	OldestPendingAge string   `json:"oldest_pending_age,omitempty"`
	Expired          uint64   `json:"expired"`
	Instances        uint32   `json:"instances"`
	CommitRate       *float64 `json:"commit_rate,omitempty"`
	RollbackRate     *float64 `json:"rollback_rate,omitempty"`
	ExpireRate       *float64 `json:"expire_rate,omitempty"`
	CheckRate        *float64 `json:"check_rate,omitempty"`
	CheckErrorRate   *float64 `json:"check_error_rate,omitempty"`
}

type consumerStatsJSON struct {
	Topic          string   `json:"topic"`
	ConsumerGroup  string   `json:"consumer_group"`
	Lag            uint64   `json:"lag"`
	LagAge         string   `json:"lag_age,omitempty"`
	InFlight       uint32   `json:"in_flight"`
	Subscribers    uint32   `json:"subscribers"`
	Retrying       uint64   `json:"retrying"`
	DeadLetters    uint64   `json:"dead_letters"`
	DeliverRate    *float64 `json:"deliver_rate,omitempty"`
	AckRate        *float64 `json:"ack_rate,omitempty"`
	RedeliverRate  *float64 `json:"redeliver_rate,omitempty"`
	DeadLetterRate *float64 `json:"dead_letter_rate,omitempty"`
}

func newStatsJSON(prev, cur *txmqv1.GetStatsResponse) statsJSON {
	r := newRater(prev, cur)
	out := statsJSON{
		TakenAt:        jsonTime(cur.GetTakenAt()),
		Leader:         cur.GetNodeId(),
		Term:           cur.GetTerm(),
		CommitIndex:    cur.GetCommitIndex(),
		AppliedIndex:   cur.GetAppliedIndex(),
		IntervalS:      r.seconds,
		Topics:         []topicStatsJSON{},
		ProducerGroups: []producerStatsJSON{},
		ConsumerGroups: []consumerStatsJSON{},
	}
	for _, t := range cur.GetTopics() {
		p := prevTopic(prev, t.GetTopic())
		out.Topics = append(out.Topics, topicStatsJSON{Topic: t.GetTopic(), Committed: t.GetCommitted(), CommitRate: r.rate(p.GetCommitted(), t.GetCommitted())})
	}
	for _, g := range cur.GetProducerGroups() {
		p := prevProducer(prev, g.GetProducerGroup())
		out.ProducerGroups = append(out.ProducerGroups, producerStatsJSON{
			ProducerGroup:    g.GetProducerGroup(),
			Pending:          g.GetPending(),
			OldestPendingAge: jsonDuration(g.GetOldestPendingAge()),
			Expired:          g.GetExpired(),
			Instances:        g.GetInstances(),
			CommitRate:       r.rate(p.GetCommittedTotal(), g.GetCommittedTotal()),
			RollbackRate:     r.rate(p.GetRolledBackTotal(), g.GetRolledBackTotal()),
			ExpireRate:       r.rate(p.GetExpiredTotal(), g.GetExpiredTotal()),
			CheckRate:        r.rate(p.GetChecksTotal(), g.GetChecksTotal()),
			CheckErrorRate:   r.rate(p.GetCheckErrorsTotal(), g.GetCheckErrorsTotal()),
		})
	}
	for _, g := range cur.GetConsumerGroups() {
		p := prevConsumer(prev, g.GetTopic(), g.GetConsumerGroup())
		out.ConsumerGroups = append(out.ConsumerGroups, consumerStatsJSON{
			Topic:          g.GetTopic(),
			ConsumerGroup:  g.GetConsumerGroup(),
			Lag:            g.GetLag(),
			LagAge:         jsonDuration(g.GetLagAge()),
			InFlight:       g.GetInFlight(),
			Subscribers:    g.GetSubscribers(),
			Retrying:       g.GetRetrying(),
			DeadLetters:    g.GetDeadLetters(),
			DeliverRate:    r.rate(p.GetDeliveredTotal(), g.GetDeliveredTotal()),
			AckRate:        r.rate(p.GetAckedTotal(), g.GetAckedTotal()),
			RedeliverRate:  r.rate(p.GetRedeliveredTotal(), g.GetRedeliveredTotal()),
			DeadLetterRate: r.rate(p.GetDeadLetteredTotal(), g.GetDeadLetteredTotal()),
		})
	}
	return out
}
