package rocketmq

import (
	"context"
	"sync"
)

// offsetCommits are the offset commits the server has received and not yet
// written, by group and topic. A client commits a stopping consumer's
// offsets without waiting for the answer (UPDATE_CONSUMER_OFFSET, one-way
// or answered to nobody) and the instance that takes its queues next asks
// for them at once (QUERY_CONSUMER_OFFSET), on another connection: RocketMQ's broker keeps offsets in memory and
// answers with the commit, while txmq's commit is a Raft write. A query
// waits for the commits received before it, so that the next instance
// starts after what the last one committed.
type offsetCommits struct {
	mu      sync.Mutex
	pending map[groupTopic]map[chan struct{}]struct{}
}

type groupTopic struct{ group, topic string }

func newOffsetCommits() *offsetCommits {
	return &offsetCommits{pending: map[groupTopic]map[chan struct{}]struct{}{}}
}

// begin records a commit of group's offsets on topic as received; the
// function it returns records it as written (or failed).
func (o *offsetCommits) begin(group, topic string) func() {
	k, done := groupTopic{group, topic}, make(chan struct{})
	o.mu.Lock()
	if o.pending[k] == nil {
		o.pending[k] = map[chan struct{}]struct{}{}
	}
	o.pending[k][done] = struct{}{}
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		delete(o.pending[k], done)
		if len(o.pending[k]) == 0 {
			delete(o.pending, k)
		}
		o.mu.Unlock()
		close(done)
	}
}

// wait waits for the commits of group's offsets on topic received so far
// (not for those that come after it).
func (o *offsetCommits) wait(ctx context.Context, group, topic string) error {
	o.mu.Lock()
	var chans []chan struct{}
	for ch := range o.pending[groupTopic{group, topic}] {
		chans = append(chans, ch)
	}
	o.mu.Unlock()
	for _, ch := range chans {
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}
