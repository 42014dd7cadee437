package raftlog

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/internal/diskio"
	"github.com/txmq/txmq/raftlog/raftpb"
)

// Proposals are merged before they reach Raft: whatever is waiting when the
// batcher takes the next batch becomes one log entry (a raftpb.Batch), so a
// burst of concurrent writes costs one encode of the entry, one log record,
// one replication message and one decode, not one of each per write. A
// lone proposal goes alone, at once. One made with MayWait waits for
// company, up to Config.Linger, when other writes came within that time:
// it then rides in the next write's entry instead of taking an entry, an
// fsync on every node and a replication round of its own just before that
// write (docs/decisions.md). While maxInflightBatches entries are being
// replicated, new proposals queue, and the next entry carries them all.
// Before it takes them, the batcher may wait, until Config.Regroup after
// the last entry's answers, for the writers it answered to write again
// (regroup), so that writers who keep writing share one entry instead of
// splitting into halves that take turns, while writes that come at their
// own pace (an open loop) do not make entries wait. One entry in flight
// made more transactions per second than two or more: a second overlaps
// the leader's fsync only with the followers' fsyncs of the first (on the
// one disk the benchmark's nodes share) and makes the entries smaller,
// each one more fsync on every node (docs/decisions.md).
const (
	maxInflightBatches = 1
	// maxBatchCommands and maxBatchBytes bound one entry; a command larger
	// than maxBatchBytes goes alone.
	maxBatchCommands = 512
	maxBatchBytes    = 1 << 20
)

type lingerKey struct{}

// A Writer is one source of proposals, such as a producer's session,
// whose next write may come as soon as it is answered: regroup waits for
// the writers the last entry answered, not for anyone's writes. Proposals
// made without one count as one writer's.
type Writer struct{ _ byte }

type writerKey struct{}

// AsWriter marks the proposals made with the context it returns as w's.
func AsWriter(ctx context.Context, w *Writer) context.Context {
	return context.WithValue(ctx, writerKey{}, w)
}

// MayWait marks the proposals made with the context it returns as ones
// that may wait up to Config.Linger for another proposal to share their
// log entry, when proposals that do not wait came within that time: writes
// whose answer nobody is waiting on to go on (a consumer's ack, whose
// confirmation only frees its delivery; a one-way commit, which is not
// answered at all).
func MayWait(ctx context.Context) context.Context {
	return context.WithValue(ctx, lingerKey{}, true)
}

// lingerFor is how long a proposal made with ctx may wait for company.
func (n *Node) lingerFor(ctx context.Context) time.Duration {
	if ctx.Value(lingerKey{}) != nil {
		return n.cfg.Linger
	}
	return 0
}

// proposal is one command waiting for its entry to be applied.
type proposal struct {
	ctx  context.Context
	at   time.Time // when propose was called, for Hooks.Proposed
	data []byte    // the encoded raftpb.Command
	// linger is how long it may wait for company (Node.lingerFor).
	linger time.Duration
	writer *Writer // nil: made without one (AsWriter)
	done   chan proposed
}

type proposed struct {
	a   applied
	err error
}

type batcher struct {
	n        *Node
	in       chan *proposal
	inflight chan struct{}
	done     chan struct{}
	// answered is the last applied entry's, for regroup.
	answered atomic.Pointer[answered]
	// The run goroutine's own: when the last proposal that does not wait
	// for company came, and regroup's back-off (after a wait that ran out,
	// the next skip entries go without one; backoff doubles with every
	// wait that runs out and halves with every one that does not).
	lastEager     time.Time
	skip, backoff int
}

// answered is what an applied entry tells regroup: how many of its
// proposals did not wait for company (writes someone waits on, whose
// writers may write again once answered), how many of them each writer
// made, and when they were answered.
type answered struct {
	writers int
	by      map[*Writer]int
	at      time.Time
}

// maxRegroupBackoff bounds how many entries go without a regroup wait
// after waits that were not worth it.
const maxRegroupBackoff = 64

func newBatcher(n *Node) *batcher {
	b := &batcher{n: n, in: make(chan *proposal), inflight: make(chan struct{}, maxInflightBatches), done: make(chan struct{})}
	go b.run()
	return b
}

// propose hands a command to the batcher and waits for its result.
func (n *Node) propose(ctx context.Context, cmd *raftpb.Command) (applied, error) {
	at := time.Now()
	data, err := proto.Marshal(cmd)
	if err != nil {
		return applied{}, fmt.Errorf("raftlog: encode command: %w", err)
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= 0 {
		return applied{}, context.DeadlineExceeded
	}
	if err := n.fsm.Stalled(); err != nil && n.IsLeader() {
		// Its store cannot commit: nothing proposed now would apply here.
		return applied{}, n.storageError(err)
	}
	p := &proposal{ctx: ctx, at: at, data: data, linger: n.lingerFor(ctx), done: make(chan proposed, 1)}
	p.writer, _ = ctx.Value(writerKey{}).(*Writer)
	stalling := n.fsm.Stalling()
	select {
	case n.batcher.in <- p:
	case <-ctx.Done():
		return applied{}, ctx.Err()
	case <-n.shutdown:
		return applied{}, ErrShutdown
	}
	for {
		select {
		case r := <-p.done:
			return r.a, r.err
		case <-ctx.Done():
			// The entry may or may not be committed: a retry with the same
			// transaction ID or key is safe.
			return applied{}, ctx.Err()
		case <-n.shutdown:
			return applied{}, ErrShutdown
		case <-stalling:
			// The store stopped committing: the entry may be applied once
			// it can again, or not (a retry is safe). Answer now rather
			// than at the caller's deadline.
			if err := n.fsm.Stalled(); err != nil {
				return applied{}, n.storageError(err)
			}
			stalling = n.fsm.Stalling()
		}
	}
}

func (b *batcher) run() {
	defer close(b.done)
	var (
		pending []*proposal // received, not yet proposed
		eager   bool        // one of pending does not wait for company
		linger  *time.Timer // the wait of the first that waits, running
		expired bool        // that wait ran out
	)
	for {
		for len(pending) == 0 || !(eager || expired) {
			var timeout <-chan time.Time
			if linger != nil {
				timeout = linger.C
			}
			select {
			case p := <-b.in:
				pending = append(pending, p)
				switch now := time.Now(); {
				case p.linger == 0:
					eager, b.lastEager = true, now
				case now.Sub(b.lastEager) >= p.linger:
					// Nothing was written lately: company is unlikely
					// to come in time, and waiting would only delay it.
					eager = true
				case linger == nil && !expired:
					linger = time.NewTimer(p.linger)
				}
			case <-timeout:
				linger, expired = nil, true
			case <-b.n.shutdown:
				answerAll(pending, nil, ErrShutdown)
				return
			}
		}
		// Waiting for a free slot is what lets a batch grow under load.
		select {
		case b.inflight <- struct{}{}:
		case <-b.n.shutdown:
			answerAll(pending, nil, ErrShutdown)
			return
		}
		var ok bool
		if pending, ok = b.regroup(pending); !ok {
			answerAll(pending, nil, ErrShutdown)
			return
		}
		var batch []*proposal
		batch, pending = b.gather(pending)
		if linger != nil {
			linger.Stop()
			linger = nil
		}
		// What did not fit has waited already: it goes next.
		eager, expired = len(pending) > 0, false
		if len(batch) == 0 {
			<-b.inflight
			continue
		}
		b.submit(batch)
	}
}

// regroup waits, before the next entry is taken, for the writers the last
// entry answered to write again: until Config.Regroup after their
// answers, and only when the entry answered two or more writes. Writers
// who write again as soon as they are answered (a producer's next
// SendHalf, Commit or Send) would otherwise split into two halves taking
// turns, one half's entry being written while the other half comes back,
// each entry carrying half of them and costing an fsync on every node and
// a replication round (docs/decisions.md). It counts the proposals that
// do not wait for company, came after the answers and are the answered
// writers', up to as many as each writer had in the entry. Counting
// anyone's, an open loop's entries would grow with the wait (an entry
// carries the writes that came during the last one's flight and during
// its wait, and the next wait is for as many), until every wait lasted
// Config.Regroup. A wait that ran out before the writers came back makes
// the next entries go without one: twice as many as the last time (1, 2,
// 4 ... up to maxRegroupBackoff); one that did not halves that. So
// writers who do not come back at once (a local transaction between
// SendHalf and Commit) seldom make an entry wait. false: the node shut
// down.
func (b *batcher) regroup(pending []*proposal) ([]*proposal, bool) {
	a := b.answered.Swap(nil)
	if a == nil || a.writers < 2 || b.n.cfg.Regroup <= 0 {
		return pending, true
	}
	left := b.n.cfg.Regroup - time.Since(a.at)
	if left <= 0 {
		// The writers who come back at once would be here: this is a
		// write after a pause, and waiting would only delay it.
		return pending, true
	}
	if b.skip > 0 {
		b.skip--
		return pending, true
	}
	// missing counts down to the answered writers' last proposal back.
	missing := a.writers
	back := func(p *proposal) {
		if p.linger == 0 && p.at.After(a.at) && a.by[p.writer] > 0 {
			a.by[p.writer]--
			missing--
		}
	}
	for _, p := range pending {
		back(p)
	}
	timer := time.NewTimer(left)
	defer timer.Stop()
wait:
	for missing > 0 {
		select {
		case p := <-b.in:
			pending = append(pending, p)
			if p.linger == 0 {
				b.lastEager = time.Now()
			}
			back(p)
		case <-timer.C:
			break wait
		case <-b.n.shutdown:
			return pending, false
		}
	}
	if missing > 0 {
		b.backoff = min(max(1, 2*b.backoff), maxRegroupBackoff)
		b.skip = b.backoff
	} else {
		b.backoff /= 2
	}
	return pending, true
}

// gather takes the pending proposals and whatever else is waiting, within
// the bounds, leaving out proposals whose caller gave up before they were
// proposed. What does not fit is returned, to start the next batch.
func (b *batcher) gather(pending []*proposal) (batch, rest []*proposal) {
	size := 0
	take := func(p *proposal) bool {
		switch {
		case p.ctx.Err() != nil:
			p.done <- proposed{err: p.ctx.Err()}
		case len(batch) > 0 && (len(batch) == maxBatchCommands || size+len(p.data) > maxBatchBytes):
			return false
		default:
			batch = append(batch, p)
			size += len(p.data)
		}
		return true
	}
	for i, p := range pending {
		if !take(p) {
			return batch, pending[i:]
		}
	}
	for {
		select {
		case p := <-b.in:
			if !take(p) {
				return batch, []*proposal{p}
			}
		default:
			return batch, nil
		}
	}
}

// submit proposes one entry for the batch and answers every proposal of it
// once the entry is applied, in the background, then frees its slot. A
// batch of one is proposed as its plain command.
func (b *batcher) submit(batch []*proposal) {
	data := batch[0].data
	if len(batch) > 1 {
		data = encodeBatch(batch)
	}
	timeout := b.n.cfg.ProposeTimeout
	for _, p := range batch {
		if dl, ok := p.ctx.Deadline(); ok {
			timeout = max(timeout, time.Until(dl))
		}
	}
	b.n.closing.RLock()
	if b.n.closed {
		b.n.closing.RUnlock()
		answerAll(batch, nil, ErrShutdown)
		return
	}
	start := time.Now()
	// Before Apply, so that the hook has run by the time the entry can be
	// applied.
	if h := b.n.cfg.Hooks.Proposed; h != nil {
		waited := make([]time.Duration, len(batch))
		for i, p := range batch {
			waited[i] = start.Sub(p.at)
		}
		h(waited)
	}
	f := b.n.raft.Apply(data, timeout)
	b.n.closing.RUnlock()
	go waitApplied(b, f, batch, start)
}

// waitApplied waits for a proposed entry's outcome. hashicorp/raft leaves
// a proposal caught by Shutdown between commit and apply unanswered; its
// waiter then stays blocked (callers return ErrShutdown). That happens only
// while a node shuts down, which is why tests tell goleak about this
// function.
func waitApplied(b *batcher, f raft.ApplyFuture, batch []*proposal, start time.Time) {
	err := b.n.applyError(f.Error())
	if err == nil {
		a := &answered{by: map[*Writer]int{}}
		for _, p := range batch {
			if p.linger == 0 {
				a.writers++
				a.by[p.writer]++
			}
		}
		a.at = time.Now()
		b.answered.Store(a)
	}
	<-b.inflight
	if err != nil {
		answerAll(batch, nil, err)
		return
	}
	if h := b.n.cfg.Hooks.Replicated; h != nil {
		h(time.Since(start))
	}
	if len(batch) == 1 {
		a, ok := f.Response().(applied)
		if !ok {
			err = errNoResult
		}
		batch[0].done <- proposed{a: a, err: err}
		return
	}
	results, ok := f.Response().([]applied)
	if !ok || len(results) != len(batch) {
		answerAll(batch, nil, errNoResult)
		return
	}
	answerAll(batch, results, nil)
}

var errNoResult = errors.New("raftlog: propose: no result (entry already applied?)")

func answerAll(batch []*proposal, results []applied, err error) {
	for i, p := range batch {
		r := proposed{err: err}
		if results != nil {
			r.a = results[i]
		}
		p.done <- r
	}
}

// applyError turns the outcome of raft.Apply into the node's errors.
func (n *Node) applyError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raft.ErrNotLeader):
		return n.notLeader()
	case errors.Is(err, raft.ErrLeadershipLost), errors.Is(err, raft.ErrLeadershipTransferInProgress), errors.Is(err, raft.ErrEnqueueTimeout):
		e := n.notLeader().(*NotLeaderError)
		e.Unknown = true
		return e
	case errors.Is(err, raft.ErrRaftShutdown):
		return ErrShutdown
	case errors.Is(err, diskio.ErrWrite):
		// The leader could not store the entry and stepped down.
		return n.storageError(err)
	}
	return fmt.Errorf("raftlog: propose: %w", err)
}

// encodeBatch builds the encoded Command{Batch{commands}} from the encoded
// commands, without decoding and encoding them again: a repeated message
// field is its elements' bytes, each behind its tag and length.
func encodeBatch(batch []*proposal) []byte {
	inner := 0
	for _, p := range batch {
		inner += protowire.SizeTag(batchCommandsField) + protowire.SizeBytes(len(p.data))
	}
	out := make([]byte, 0, protowire.SizeTag(commandBatchField)+protowire.SizeBytes(inner))
	out = protowire.AppendTag(out, commandBatchField, protowire.BytesType)
	out = protowire.AppendVarint(out, uint64(inner))
	for _, p := range batch {
		out = protowire.AppendTag(out, batchCommandsField, protowire.BytesType)
		out = protowire.AppendBytes(out, p.data)
	}
	return out
}

// The field numbers of Command.batch and Batch.commands.
var (
	commandBatchField  = (&raftpb.Command{}).ProtoReflect().Descriptor().Fields().ByName("batch").Number()
	batchCommandsField = (&raftpb.Batch{}).ProtoReflect().Descriptor().Fields().ByName("commands").Number()
)
