package broker

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
	"github.com/txmq/txmq/halfstore"
	"github.com/txmq/txmq/halfstore/storepb"
	"github.com/txmq/txmq/raftlog/raftpb"
)

type adminService struct {
	txmqv1.UnimplementedAdminServiceServer
	b *Broker
}

const (
	defaultListLimit = 100
	maxListLimit     = 1000
)

func (s *adminService) ClusterStatus(ctx context.Context, req *txmqv1.ClusterStatusRequest) (*txmqv1.ClusterStatusResponse, error) {
	st, err := s.b.node.Status()
	if err != nil {
		return nil, err
	}
	resp := &txmqv1.ClusterStatusResponse{
		NodeId:            st.NodeID,
		State:             stateName(st.State),
		LeaderId:          st.LeaderID,
		LeaderRaftAddress: st.LeaderRaftAddr,
		Term:              st.Term,
		CommitIndex:       st.CommitIndex,
		AppliedIndex:      st.AppliedIndex,
		LastLogIndex:      st.LastLogIndex,
		StoreAppliedIndex: st.StoreAppliedIndex,
	}
	if st.LeaderID != "" {
		resp.LeaderAddress = s.b.nodeAddr(st.LeaderID)
	}
	for _, m := range st.Members {
		resp.Nodes = append(resp.Nodes, &txmqv1.ClusterNode{
			Id: m.ID, RaftAddress: m.RaftAddr, Suffrage: suffrageName(m.Suffrage), Leader: m.Leader,
			GrpcAddress: s.b.nodeAddr(m.ID),
		})
	}
	if !req.Local {
		s.b.memberViews(ctx, resp)
	}
	return resp, nil
}

// memberViews asks every member for its own status (in parallel, briefly)
// and fills in each one's state, applied index and lag behind the highest
// commit index seen.
func (b *Broker) memberViews(ctx context.Context, resp *txmqv1.ClusterStatusResponse) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	views := make([]*txmqv1.ClusterStatusResponse, len(resp.Nodes))
	var wg sync.WaitGroup
	for i, n := range resp.Nodes {
		if n.Id == resp.NodeId {
			views[i] = resp
			continue
		}
		if n.GrpcAddress == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := grpc.NewClient(n.GrpcAddress, b.peerDialOptions()...)
			if err != nil {
				return
			}
			defer conn.Close()
			v, err := txmqv1.NewAdminServiceClient(conn).ClusterStatus(ctx, &txmqv1.ClusterStatusRequest{Local: true})
			if err == nil {
				views[i] = v
			}
		}()
	}
	wg.Wait()
	commit := resp.CommitIndex
	for _, v := range views {
		if v != nil {
			commit = max(commit, v.CommitIndex)
		}
	}
	for i, n := range resp.Nodes {
		v := views[i]
		if v == nil {
			continue
		}
		n.Reachable = true
		n.State = v.State
		n.AppliedIndex = v.AppliedIndex
		n.Lag = commit - min(commit, v.AppliedIndex)
	}
}

func stateName(s string) string {
	switch s {
	case "Leader":
		return "LEADER"
	case "Follower":
		return "FOLLOWER"
	case "Candidate":
		return "CANDIDATE"
	case "Shutdown":
		return "SHUTDOWN"
	}
	return s
}

func suffrageName(s string) string {
	switch s {
	case "Voter":
		return "VOTER"
	case "Nonvoter":
		return "NONVOTER"
	case "Staging":
		return "STAGING"
	}
	return s
}

func (s *adminService) CreateTopic(ctx context.Context, req *txmqv1.CreateTopicRequest) (*txmqv1.CreateTopicResponse, error) {
	if err := checkTopic(req.Name); err != nil {
		return nil, err
	}
	r, err := s.b.node.CreateTopic(ctx, s.b.clock.Now(), &raftpb.CreateTopic{Name: req.Name})
	if err != nil {
		return nil, err
	}
	if r.Created {
		s.b.log.Info("topic created", "topic", req.Name)
	}
	// An existing topic is returned as it is, with its groups.
	var groups []*storepb.Group
	if err := s.b.node.Store().View(func(tx *halfstore.Tx) error {
		var err error
		groups, err = tx.Groups(req.Name)
		return err
	}); err != nil {
		return nil, err
	}
	return &txmqv1.CreateTopicResponse{Topic: topicToAPI(r.Topic, groups), Created: r.Created}, nil
}

func topicToAPI(t *storepb.Topic, groups []*storepb.Group) *txmqv1.Topic {
	out := &txmqv1.Topic{Name: t.Name, CreatedAt: ts(t.CreatedAt), LastSequence: t.LastSequence,
		FirstSequence: t.FirstSequence, Bytes: t.Bytes}
	if t.FirstSequence > 0 && t.LastSequence >= t.FirstSequence {
		out.Messages = t.LastSequence - t.FirstSequence + 1
	}
	for _, g := range groups {
		out.ConsumerGroups = append(out.ConsumerGroups, g.Name)
	}
	return out
}

func (s *adminService) ListTopics(ctx context.Context, _ *txmqv1.ListTopicsRequest) (*txmqv1.ListTopicsResponse, error) {
	resp := &txmqv1.ListTopicsResponse{}
	err := s.b.node.Store().View(func(tx *halfstore.Tx) error {
		topics, err := tx.Topics()
		if err != nil {
			return err
		}
		for _, t := range topics {
			groups, err := tx.Groups(t.Name)
			if err != nil {
				return err
			}
			resp.Topics = append(resp.Topics, topicToAPI(t, groups))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *adminService) ListHalfMessages(ctx context.Context, req *txmqv1.ListHalfMessagesRequest) (*txmqv1.ListHalfMessagesResponse, error) {
	f, err := s.b.halfFilter(req)
	if err != nil {
		return nil, err
	}
	limit := listLimit(req.Limit)
	resp := &txmqv1.ListHalfMessagesResponse{}
	err = s.b.leaderView(func(tx *halfstore.Tx) error {
		// One more than asked tells whether a next page exists.
		hs, err := tx.FindHalf(f, req.PageToken, limit+1)
		if err != nil {
			return err
		}
		if len(hs) > limit {
			hs = hs[:limit]
			resp.NextPageToken = hs[limit-1].Id
		}
		for _, h := range hs {
			// Bodies stay out of listings: a page of large messages would
			// not fit in a response. GetHalfMessage returns the body.
			m := halfToAPI(h)
			m.Body = nil
			resp.Messages = append(resp.Messages, m)
		}
		total, err := tx.CountHalf(f)
		resp.Total = uint64(total)
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// halfFilter checks the filters of a ListHalfMessages request. older_than
// counts on the leader's clock, which stamped created_at.
func (b *Broker) halfFilter(req *txmqv1.ListHalfMessagesRequest) (halfstore.HalfFilter, error) {
	var f halfstore.HalfFilter
	for _, name := range []struct{ kind, v string }{{"producer_group", req.ProducerGroup}, {"topic", req.Topic}} {
		if name.v != "" {
			if err := checkName(name.kind, name.v); err != nil {
				return f, err
			}
		}
	}
	if len(req.TransactionId) > maxTxIDLen {
		return f, invalidf("transaction_id is %d bytes, over the limit of %d", len(req.TransactionId), maxTxIDLen)
	}
	state, err := storeHalfState(req.State)
	if err != nil {
		return f, err
	}
	f = halfstore.HalfFilter{Group: req.ProducerGroup, State: state, Topic: req.Topic, TxID: req.TransactionId}
	if req.OlderThan != nil {
		if err := req.OlderThan.CheckValid(); err != nil || req.OlderThan.AsDuration() < 0 {
			return f, invalidf("older_than must be a duration of 0 or more")
		}
		f.CreatedBefore = b.clock.Now().Add(-req.OlderThan.AsDuration()).UnixNano()
	}
	return f, nil
}

// listLimit is the size of a page asked for as n: 0 means the default, and
// more than the most is the most.
func listLimit(n uint32) int {
	switch {
	case n == 0:
		return defaultListLimit
	case n > maxListLimit:
		return maxListLimit
	}
	return int(n)
}

func (s *adminService) GetHalfMessage(ctx context.Context, req *txmqv1.GetHalfMessageRequest) (*txmqv1.GetHalfMessageResponse, error) {
	ref, err := checkHalfRef(req.MessageId, req.Transaction)
	if err != nil {
		return nil, err
	}
	var h *storepb.Half
	err = s.b.leaderView(func(tx *halfstore.Tx) error {
		var err error
		h, err = ref.half(tx)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &txmqv1.GetHalfMessageResponse{Message: halfToAPI(h)}, nil
}

func (s *adminService) ResolveHalfMessage(ctx context.Context, req *txmqv1.ResolveHalfMessageRequest) (*txmqv1.ResolveHalfMessageResponse, error) {
	ref, err := checkHalfRef(req.MessageId, req.Transaction)
	if err != nil {
		return nil, err
	}
	h, err := s.b.resolve(ctx, ref.resolve(storepb.Source_SOURCE_OPERATOR), req.Resolution)
	if err != nil {
		return nil, err
	}
	return &txmqv1.ResolveHalfMessageResponse{Message: h}, nil
}

type notFoundGroup struct{ name string }

func (e *notFoundGroup) Error() string {
	return "consumer group " + e.name + " not found: it is created by its first subscription (with auto-create-topics) or by brokerctl group create"
}
func (e *notFoundGroup) Unwrap() error { return halfstore.ErrNotFound }

// leaderView runs fn in a View of the store once the read is current: only
// the leader serves it, after confirming with a majority that it still is
// the leader and applying what was committed before. Followers refuse with
// the leader's address.
func (b *Broker) leaderView(fn func(*halfstore.Tx) error) error {
	if err := b.leaderOnly(); err != nil {
		return err
	}
	if err := b.node.VerifyLeader(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.node.Barrier(ctx); err != nil {
		return err
	}
	return b.node.Store().View(fn)
}
