package broker

import (
	"sync"

	"github.com/txmq/txmq/raftlog"
)

// notifier wakes the dispatchers of a topic when the FSM appends to it.
// A wake-up is a closed channel: waiters take the current channel, check the
// store, and wait on it; onApply closes it and installs a fresh one.
type notifier struct {
	mu     sync.Mutex
	topics map[string]chan struct{}
}

func newNotifier() *notifier { return &notifier{topics: map[string]chan struct{}{}} }

// wait returns a channel closed at the next append to topic.
func (n *notifier) wait(topic string) <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	ch, ok := n.topics[topic]
	if !ok {
		ch = make(chan struct{})
		n.topics[topic] = ch
	}
	return ch
}

func (n *notifier) onApply(events []raftlog.Event) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range events {
		if e.Kind == raftlog.EventResolved {
			// A resolution wakes through the EventAppended of its commit.
			continue
		}
		if ch, ok := n.topics[e.Topic]; ok {
			close(ch)
			delete(n.topics, e.Topic)
		}
	}
}
