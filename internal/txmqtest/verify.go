package txmqtest

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog"
)

// VerifyStores waits (up to a minute) until the nodes have applied the
// same index and their Raft logs end at the same index in the same term,
// then checks that their stores hold the same data, read through
// halfstore: topics and their logs, consumer groups with their acks,
// retries, dead letters and redriven letters, half messages with their
// transaction and state indexes, the check schedule, producer and consumer
// group policies, and the API address of every member. On a mismatch it
// fails the test with the first difference.
//
// What halfstore cannot list is left out: Send dedup keys, the policy of a
// group that has no half message nor progress, and the address of a node
// no longer in the configuration.
func VerifyStores(t testing.TB, nodes ...*raftlog.Node) {
	t.Helper()
	if len(nodes) == 0 {
		return
	}
	var dumps []storeDump
	CheckFor(t, time.Minute, 50*time.Millisecond, func() error {
		var err error
		dumps, err = dumpAll(nodes)
		return err
	})
	for i, d := range dumps[1:] {
		if diff := firstDiff(dumps[0], d); diff != "" {
			t.Fatalf("VerifyStores: %s and %s, both applied through index %d, differ: %s",
				nodes[0].ID(), nodes[i+1].ID(), d.applied, diff)
		}
	}
}

// StoreContent is the content of a node's store as VerifyStores compares
// it, one entry a line: what a test compares before and after a call that
// must change nothing.
func StoreContent(t testing.TB, node *raftlog.Node) string {
	t.Helper()
	d, err := dumpStore(node.Store(), nil)
	if err != nil {
		t.Fatalf("StoreContent: %v", err)
	}
	var b strings.Builder
	for _, e := range d.entries {
		fmt.Fprintf(&b, "%s = %s\n", e.key, e.text)
	}
	return b.String()
}

// storeDump is a store's content as entries in a fixed order.
type storeDump struct {
	applied uint64
	entries []entry
}

type entry struct {
	key string
	// val is what is compared: a record's deterministic encoding, or text.
	val []byte
	// text is what a mismatch shows.
	text string
}

// dumpAll dumps every node's store once they agree on where they are.
func dumpAll(nodes []*raftlog.Node) ([]storeDump, error) {
	var first raftlog.Status
	var members []string
	for i, n := range nodes {
		st, err := n.Status()
		if err != nil {
			return nil, err
		}
		if i == 0 {
			first = st
		}
		if st.LastLogIndex != first.LastLogIndex || st.Term != first.Term || st.StoreAppliedIndex != first.StoreAppliedIndex {
			return nil, fmt.Errorf("%s's log ends at %d in term %d, applied through %d; %s's at %d in term %d, applied through %d",
				n.ID(), st.LastLogIndex, st.Term, st.StoreAppliedIndex, nodes[0].ID(), first.LastLogIndex, first.Term, first.StoreAppliedIndex)
		}
		for _, m := range st.Members {
			if !slices.Contains(members, m.ID) {
				members = append(members, m.ID)
			}
		}
	}
	slices.Sort(members)
	var dumps []storeDump
	for i, n := range nodes {
		d, err := dumpStore(n.Store(), members)
		if err != nil {
			return nil, fmt.Errorf("dump %s: %w", n.ID(), err)
		}
		// An entry may have been applied since the statuses were read.
		if i > 0 && d.applied != dumps[0].applied {
			return nil, fmt.Errorf("%s applied through %d, %s through %d", n.ID(), d.applied, nodes[0].ID(), dumps[0].applied)
		}
		dumps = append(dumps, d)
	}
	return dumps, nil
}

func firstDiff(a, b storeDump) string {
	for i := 0; i < max(len(a.entries), len(b.entries)); i++ {
		switch {
		case i >= len(a.entries):
			return fmt.Sprintf("only the second has %s = %s", b.entries[i].key, b.entries[i].text)
		case i >= len(b.entries):
			return fmt.Sprintf("only the first has %s = %s", a.entries[i].key, a.entries[i].text)
		}
		ea, eb := a.entries[i], b.entries[i]
		if ea.key != eb.key {
			return fmt.Sprintf("the first has %s = %s where the second has %s = %s", ea.key, ea.text, eb.key, eb.text)
		}
		if !bytes.Equal(ea.val, eb.val) {
			return fmt.Sprintf("%s is %s in the first, %s in the second", ea.key, ea.text, eb.text)
		}
	}
	return ""
}

// dumper collects entries in one read transaction.
type dumper struct {
	tx      *halfstore.Tx
	entries []entry
	err     error
}

func (d *dumper) record(key string, m proto.Message) {
	val, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil && d.err == nil {
		d.err = err
	}
	text := prototext.MarshalOptions{}.Format(m)
	if len(text) > 300 {
		text = text[:300] + "..."
	}
	d.entries = append(d.entries, entry{key: key, val: val, text: "{" + text + "}"})
}

func (d *dumper) value(key string, v any) {
	text := fmt.Sprint(v)
	d.entries = append(d.entries, entry{key: key, val: []byte(text), text: text})
}

func dumpStore(s *halfstore.Store, members []string) (storeDump, error) {
	var out storeDump
	err := s.View(func(tx *halfstore.Tx) error {
		d := &dumper{tx: tx}
		out.applied = tx.AppliedIndex()
		groups, err := d.topics()
		if err != nil {
			return err
		}
		producers, err := d.halves()
		if err != nil {
			return err
		}
		if err := d.policies(producers, groups); err != nil {
			return err
		}
		for _, id := range members {
			addr, err := tx.NodeAddr(id)
			if err != nil {
				return err
			}
			d.value("node "+id, addr)
		}
		out.entries = d.entries
		return d.err
	})
	return out, err
}

// page is how many records one read takes.
const page = 1024

// topics dumps the topics, their logs and their consumer groups, and
// returns the names of those groups.
func (d *dumper) topics() ([]string, error) {
	topics, err := d.tx.Topics()
	if err != nil {
		return nil, err
	}
	var groups []string
	for _, tp := range topics {
		d.record("topic "+tp.Name, tp)
		for from := tp.FirstSequence; ; {
			msgs, err := d.tx.ReadTopic(tp.Name, from, page)
			if err != nil {
				return nil, err
			}
			if len(msgs) == 0 {
				break
			}
			for _, m := range msgs {
				d.record(fmt.Sprintf("topic %s message %d", tp.Name, m.Sequence), m)
			}
			from = msgs[len(msgs)-1].Sequence + 1
		}
		gs, err := d.tx.Groups(tp.Name)
		if err != nil {
			return nil, err
		}
		for _, g := range gs {
			if err := d.group(tp, g); err != nil {
				return nil, err
			}
			if !slices.Contains(groups, g.Name) {
				groups = append(groups, g.Name)
			}
		}
	}
	return groups, nil
}

// group dumps a consumer group's progress on a topic.
func (d *dumper) group(tp *storepb.Topic, g *storepb.Group) error {
	key := fmt.Sprintf("group %s on %s", g.Name, tp.Name)
	d.record(key, g)
	acked, err := d.tx.AckedAbove(tp.Name, g.Name)
	if err != nil {
		return err
	}
	d.value(key+" acked above", acked)
	for seq := tp.FirstSequence; seq <= tp.LastSequence; seq++ {
		r, err := d.tx.Retry(tp.Name, g.Name, seq)
		if err != nil {
			return err
		}
		if r != nil {
			d.record(fmt.Sprintf("%s retry %d", key, seq), r)
		}
	}
	for after := uint64(0); ; {
		dls, err := d.tx.DeadLetters(tp.Name, g.Name, after, page)
		if err != nil {
			return err
		}
		if len(dls) == 0 {
			break
		}
		d.letters(key+" dead letter", dls)
		after = dls[len(dls)-1].Message.GetSequence()
	}
	for from := uint64(0); ; {
		dls, err := d.tx.ReadRedriven(tp.Name, g.Name, from, page)
		if err != nil || len(dls) == 0 {
			return err
		}
		d.letters(key+" redriven", dls)
		from = dls[len(dls)-1].Message.GetSequence() + 1
	}
}

func (d *dumper) letters(key string, dls []*storepb.DeadLetter) {
	for _, dl := range dls {
		d.record(fmt.Sprintf("%s %d", key, dl.Message.GetSequence()), dl)
	}
}

// halves dumps the half messages and their indexes, and returns the
// producer groups they belong to.
func (d *dumper) halves() ([]string, error) {
	var groups []string
	for after := ""; ; {
		hs, err := d.tx.ListHalf("", storepb.HalfState_HALF_STATE_UNSPECIFIED, after, page)
		if err != nil {
			return nil, err
		}
		if len(hs) == 0 {
			break
		}
		for _, h := range hs {
			d.record("half "+h.Id, h)
			id, err := d.tx.HalfIDByTx(h.ProducerGroup, h.TransactionId)
			if err != nil {
				return nil, err
			}
			d.value(fmt.Sprintf("transaction %s of %s", h.TransactionId, h.ProducerGroup), id)
			if !slices.Contains(groups, h.ProducerGroup) {
				groups = append(groups, h.ProducerGroup)
			}
		}
		after = hs[len(hs)-1].Id
	}
	states := make([]int32, 0, len(storepb.HalfState_name))
	for st := range storepb.HalfState_name {
		states = append(states, st)
	}
	slices.Sort(states)
	for _, st := range states {
		hs := storepb.HalfState(st)
		d.value("half messages "+hs.String(), d.tx.CountState(hs))
	}
	return groups, nil
}

// policies dumps the producer groups' policies and check schedules, and
// the consumer groups' policies.
func (d *dumper) policies(producers, consumers []string) error {
	scheduled, err := d.tx.ScheduledGroups()
	if err != nil {
		return err
	}
	for _, g := range scheduled {
		if !slices.Contains(producers, g) {
			producers = append(producers, g)
		}
	}
	slices.Sort(producers)
	for _, g := range producers {
		pg, err := d.tx.ProducerGroup(g)
		if err != nil {
			return err
		}
		d.record("producer group "+g, pg)
		var ids []string
		d.tx.PendingIDs(g, func(id []byte) { ids = append(ids, string(id)) })
		d.value("schedule of "+g, ids)
	}
	slices.Sort(consumers)
	for _, g := range consumers {
		cg, err := d.tx.ConsumerGroup(g)
		if err != nil {
			return err
		}
		d.record("consumer group "+g, cg)
	}
	return nil
}
