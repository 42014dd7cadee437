package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	txmqv1 "github.com/txmq/txmq/api/gen/txmq/v1"
)

// JSON output: one object per line. Field names are the proto field names,
// except that a message ID is "id" and a body is "body" (text, when it is
// valid UTF-8) or "body_base64" (anything else). Times are RFC 3339 in UTC,
// and absent when unset. Durations are Go duration strings ("6s", "1m0s"),
// and absent when unset. Enum values drop their prefix: "PENDING", not
// "HALF_STATE_PENDING".

// jsonBody holds exactly one of body and body_base64.
type jsonBody struct {
	Body       *string `json:"body,omitempty"`
	BodyBase64 string  `json:"body_base64,omitempty"`
}

func newJSONBody(b []byte) jsonBody {
	if utf8.Valid(b) {
		s := string(b)
		return jsonBody{Body: &s}
	}
	return jsonBody{BodyBase64: base64.StdEncoding.EncodeToString(b)}
}

type sendJSON struct {
	ID        string `json:"id"`
	Sequence  uint64 `json:"sequence"`
	Duplicate bool   `json:"duplicate"`
}

type halfSendJSON struct {
	ID        string `json:"id"`
	Duplicate bool   `json:"duplicate"`
	State     string `json:"state"`
}

type halfJSON struct {
	ID            string            `json:"id"`
	Topic         string            `json:"topic"`
	ProducerGroup string            `json:"producer_group"`
	TransactionID string            `json:"transaction_id"`
	Key           string            `json:"key"`
	Properties    map[string]string `json:"properties"`
	jsonBody
	BodySize         uint32 `json:"body_size"`
	State            string `json:"state"`
	CreatedAt        string `json:"created_at,omitempty"`
	ResolvedAt       string `json:"resolved_at,omitempty"`
	ResolutionSource string `json:"resolution_source,omitempty"`
	Sequence         uint64 `json:"sequence"`
	CheckAttempts    uint32 `json:"check_attempts"`
	NextCheckAt      string `json:"next_check_at,omitempty"`
	LastCheckError   string `json:"last_check_error,omitempty"`
}

func newHalfJSON(m *txmqv1.HalfMessage) halfJSON {
	return halfJSON{
		ID:               m.GetMessageId(),
		Topic:            m.GetTopic(),
		ProducerGroup:    m.GetProducerGroup(),
		TransactionID:    m.GetTransactionId(),
		Key:              m.GetKey(),
		Properties:       nonNil(m.GetProperties()),
		jsonBody:         newJSONBody(m.GetBody()),
		BodySize:         m.GetBodySize(),
		State:            stateName(m.GetState()),
		CreatedAt:        jsonTime(m.GetCreatedAt()),
		ResolvedAt:       jsonTime(m.GetResolvedAt()),
		ResolutionSource: sourceName(m.GetResolutionSource()),
		Sequence:         m.GetSequence(),
		CheckAttempts:    m.GetCheckAttempts(),
		NextCheckAt:      jsonTime(m.GetNextCheckAt()),
		LastCheckError:   m.GetLastCheckError(),
	}
}

type deliveryJSON struct {
	ID         string            `json:"id"`
	Topic      string            `json:"topic"`
	Key        string            `json:"key"`
	Properties map[string]string `json:"properties"`
	jsonBody
	Attempt       uint32 `json:"attempt"`
	Sequence      uint64 `json:"sequence"`
	CommittedAt   string `json:"committed_at,omitempty"`
	ProducerGroup string `json:"producer_group,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
	OrderingKey   string `json:"ordering_key,omitempty"`
	AckDeadline   string `json:"ack_deadline,omitempty"`
	LastError     string `json:"last_error,omitempty"`
}

func newDeliveryJSON(d *txmqv1.Delivery) deliveryJSON {
	return deliveryJSON{
		ID:            d.GetMessageId(),
		Topic:         d.GetTopic(),
		Key:           d.GetKey(),
		Properties:    nonNil(d.GetProperties()),
		jsonBody:      newJSONBody(d.GetBody()),
		Attempt:       d.GetAttempt(),
		Sequence:      d.GetSequence(),
		CommittedAt:   jsonTime(d.GetCommittedAt()),
		ProducerGroup: d.GetProducerGroup(),
		TransactionID: d.GetTransactionId(),
		OrderingKey:   d.GetOrderingKey(),
		AckDeadline:   jsonTime(d.GetAckDeadline()),
		LastError:     d.GetLastError(),
	}
}

type topicJSON struct {
	Name           string   `json:"name"`
	CreatedAt      string   `json:"created_at,omitempty"`
	FirstSequence  uint64   `json:"first_sequence"`
	LastSequence   uint64   `json:"last_sequence"`
	Messages       uint64   `json:"messages"`
	Bytes          uint64   `json:"bytes"`
	ConsumerGroups []string `json:"consumer_groups"`
}

func newTopicJSON(t *txmqv1.Topic) topicJSON {
	return topicJSON{
		Name:           t.GetName(),
		CreatedAt:      jsonTime(t.GetCreatedAt()),
		FirstSequence:  t.GetFirstSequence(),
		LastSequence:   t.GetLastSequence(),
		Messages:       t.GetMessages(),
		Bytes:          t.GetBytes(),
		ConsumerGroups: append([]string{}, t.GetConsumerGroups()...),
	}
}

type topicCreateJSON struct {
	topicJSON
	Created bool `json:"created"`
}

type groupJSON struct {
	ConsumerGroup string           `json:"consumer_group"`
	Topics        []groupTopicJSON `json:"topics"`
	// Config is absent when the broker sent none.
	Config *consumerConfigJSON `json:"config,omitempty"`
}

type groupTopicJSON struct {
	Topic           string `json:"topic"`
	AckedThrough    uint64 `json:"acked_through"`
	AckedAbove      uint64 `json:"acked_above"`
	FirstSequence   uint64 `json:"first_sequence"`
	LastSequence    uint64 `json:"last_sequence"`
	Lag             uint64 `json:"lag"`
	OldestUnackedAt string `json:"oldest_unacked_at,omitempty"`
	LagAge          string `json:"lag_age,omitempty"`
	InFlight        uint32 `json:"in_flight"`
	Redeliveries    uint64 `json:"redeliveries"`
	Retrying        uint64 `json:"retrying"`
	DeadLetters     uint64 `json:"dead_letters"`
	Dropped         uint64 `json:"dropped"`
	Subscribers     uint32 `json:"subscribers"`
	CreatedAt       string `json:"created_at,omitempty"`
}

func newGroupTopicJSON(t *txmqv1.GroupTopicStatus) groupTopicJSON {
	return groupTopicJSON{
		Topic:           t.GetTopic(),
		AckedThrough:    t.GetAckedThrough(),
		AckedAbove:      t.GetAckedAbove(),
		FirstSequence:   t.GetFirstSequence(),
		LastSequence:    t.GetLastSequence(),
		Lag:             t.GetLag(),
		OldestUnackedAt: jsonTime(t.GetOldestUnackedAt()),
		LagAge:          jsonDuration(t.GetLagAge()),
		InFlight:        t.GetInFlight(),
		Redeliveries:    t.GetRedeliveries(),
		Retrying:        t.GetRetrying(),
		DeadLetters:     t.GetDeadLetters(),
		Dropped:         t.GetDropped(),
		Subscribers:     t.GetSubscribers(),
		CreatedAt:       jsonTime(t.GetCreatedAt()),
	}
}

// groupRowJSON is a line of group list: a group's progress on one topic.
type groupRowJSON struct {
	ConsumerGroup string `json:"consumer_group"`
	groupTopicJSON
}

// consumerConfigJSON leaves out what the broker left unset, like
// groupConfigJSON.
type consumerConfigJSON struct {
	ConsumerGroup     string   `json:"consumer_group"`
	MaxDeliveries     *uint32  `json:"max_deliveries,omitempty"`
	AckDeadline       string   `json:"ack_deadline,omitempty"`
	RedeliveryBackoff []string `json:"redelivery_backoff,omitempty"`
	OrderedPoison     string   `json:"ordered_poison,omitempty"`
}

func newConsumerConfigJSON(cfg *txmqv1.ConsumerGroupConfig) consumerConfigJSON {
	var backoff []string
	for _, d := range cfg.GetRedeliveryBackoff() {
		backoff = append(backoff, jsonDuration(d))
	}
	var maxDeliveries *uint32
	if cfg != nil {
		maxDeliveries = cfg.MaxDeliveries
	}
	return consumerConfigJSON{
		ConsumerGroup:     cfg.GetConsumerGroup(),
		MaxDeliveries:     maxDeliveries,
		AckDeadline:       jsonDuration(cfg.GetAckDeadline()),
		RedeliveryBackoff: backoff,
		OrderedPoison:     poisonName(cfg.GetOrderedPoison()),
	}
}

type resetJSON struct {
	ConsumerGroup   string `json:"consumer_group"`
	Topic           string `json:"topic"`
	OldAckedThrough uint64 `json:"old_acked_through"`
	NewAckedThrough uint64 `json:"new_acked_through"`
	LagBefore       uint64 `json:"lag_before"`
	LagAfter        uint64 `json:"lag_after"`
	DryRun          bool   `json:"dry_run"`
}

// deadLetterJSON holds the body only when it was asked for (dlq show):
// ListDeadLetters sends none.
type deadLetterJSON struct {
	ConsumerGroup string            `json:"consumer_group"`
	Topic         string            `json:"topic"`
	ID            string            `json:"id"`
	Sequence      uint64            `json:"sequence"`
	Attempts      uint32            `json:"attempts"`
	LastError     string            `json:"last_error,omitempty"`
	DeadAt        string            `json:"dead_at,omitempty"`
	CommittedAt   string            `json:"committed_at,omitempty"`
	Key           string            `json:"key"`
	OrderingKey   string            `json:"ordering_key"`
	Properties    map[string]string `json:"properties"`
	*jsonBody
	BodySize      uint32 `json:"body_size"`
	ProducerGroup string `json:"producer_group,omitempty"`
	TransactionID string `json:"transaction_id,omitempty"`
}

func newDeadLetterJSON(dl *txmqv1.DeadLetter, withBody bool) deadLetterJSON {
	out := deadLetterJSON{
		ConsumerGroup: dl.GetConsumerGroup(),
		Topic:         dl.GetTopic(),
		ID:            dl.GetMessageId(),
		Sequence:      dl.GetSequence(),
		Attempts:      dl.GetAttempts(),
		LastError:     dl.GetLastError(),
		DeadAt:        jsonTime(dl.GetDeadAt()),
		CommittedAt:   jsonTime(dl.GetCommittedAt()),
		Key:           dl.GetKey(),
		OrderingKey:   dl.GetOrderingKey(),
		Properties:    nonNil(dl.GetProperties()),
		BodySize:      dl.GetBodySize(),
		ProducerGroup: dl.GetProducerGroup(),
		TransactionID: dl.GetTransactionId(),
	}
	if withBody {
		b := newJSONBody(dl.GetBody())
		out.jsonBody = &b
	}
	return out
}

type redriveJSON struct {
	ConsumerGroup string `json:"consumer_group"`
	Redriven      uint64 `json:"redriven"`
}

type purgeJSON struct {
	ConsumerGroup string `json:"consumer_group"`
	Purged        uint64 `json:"purged"`
}

type halfCheckJSON struct {
	Answer     string    `json:"answer,omitempty"`
	InstanceID string    `json:"instance_id"`
	Endpoint   string    `json:"endpoint"`
	Error      string    `json:"error,omitempty"`
	Message    *halfJSON `json:"message,omitempty"`
}

func newHalfCheckJSON(resp *txmqv1.CheckHalfMessageResponse) halfCheckJSON {
	out := halfCheckJSON{
		Answer:     resolutionName(resp.GetAnswer()),
		InstanceID: resp.GetInstanceId(),
		Endpoint:   resp.GetEndpoint(),
		Error:      resp.GetError(),
	}
	if m := resp.GetMessage(); m != nil {
		hj := newHalfJSON(m)
		out.Message = &hj
	}
	return out
}

type producerJSON struct {
	ProducerGroup  string       `json:"producer_group"`
	InstanceID     string       `json:"instance_id"`
	Endpoint       endpointJSON `json:"endpoint"`
	RegisteredAt   string       `json:"registered_at,omitempty"`
	LastHeartbeat  string       `json:"last_heartbeat,omitempty"`
	LeaseExpiresAt string       `json:"lease_expires_at,omitempty"`
}

// endpointJSON holds at most one of grpc_address and http_url, like the
// CallbackEndpoint oneof.
type endpointJSON struct {
	GrpcAddress string `json:"grpc_address,omitempty"`
	HTTPURL     string `json:"http_url,omitempty"`
}

func newProducerJSON(p *txmqv1.ProducerInstance) producerJSON {
	return producerJSON{
		ProducerGroup: p.GetProducerGroup(),
		InstanceID:    p.GetInstanceId(),
		Endpoint: endpointJSON{
			GrpcAddress: p.GetEndpoint().GetGrpcAddress(),
			HTTPURL:     p.GetEndpoint().GetHttpUrl(),
		},
		RegisteredAt:   jsonTime(p.GetRegisteredAt()),
		LastHeartbeat:  jsonTime(p.GetLastHeartbeat()),
		LeaseExpiresAt: jsonTime(p.GetLeaseExpiresAt()),
	}
}

// groupConfigJSON leaves out what the broker left unset, so that a field is
// absent rather than a misleading zero.
type groupConfigJSON struct {
	ProducerGroup   string  `json:"producer_group"`
	MaxChecks       *uint32 `json:"max_checks,omitempty"`
	CheckBackoff    string  `json:"check_backoff,omitempty"`
	MaxCheckBackoff string  `json:"max_check_backoff,omitempty"`
	MaxHalfAge      string  `json:"max_half_age,omitempty"`
	ExpiryAction    string  `json:"expiry_action,omitempty"`
	CallbackURL     *string `json:"callback_url,omitempty"`
}

func newGroupConfigJSON(cfg *txmqv1.ProducerGroupConfig) groupConfigJSON {
	var maxChecks *uint32
	if cfg != nil {
		maxChecks = cfg.MaxChecks
	}
	return groupConfigJSON{
		ProducerGroup:   cfg.GetProducerGroup(),
		MaxChecks:       maxChecks,
		CheckBackoff:    jsonDuration(cfg.GetCheckBackoff()),
		MaxCheckBackoff: jsonDuration(cfg.GetMaxCheckBackoff()),
		MaxHalfAge:      jsonDuration(cfg.GetMaxHalfAge()),
		ExpiryAction:    expiryName(cfg.GetExpiryAction()),
		CallbackURL:     cfg.CallbackUrl,
	}
}

type clusterJSON struct {
	NodeID            string            `json:"node_id"`
	State             string            `json:"state"`
	LeaderID          string            `json:"leader_id"`
	LeaderRaftAddress string            `json:"leader_raft_address"`
	LeaderAddress     string            `json:"leader_address"`
	Term              uint64            `json:"term"`
	CommitIndex       uint64            `json:"commit_index"`
	AppliedIndex      uint64            `json:"applied_index"`
	LastLogIndex      uint64            `json:"last_log_index"`
	StoreAppliedIndex uint64            `json:"store_applied_index"`
	Nodes             []clusterNodeJSON `json:"nodes"`
}

type clusterNodeJSON struct {
	ID          string `json:"id"`
	RaftAddress string `json:"raft_address"`
	GrpcAddress string `json:"grpc_address"`
	Suffrage    string `json:"suffrage"`
	Leader      bool   `json:"leader"`
	// As the node answered when asked; reachable is false when it did not.
	Reachable    bool   `json:"reachable"`
	State        string `json:"state,omitempty"`
	AppliedIndex uint64 `json:"applied_index"`
	Lag          uint64 `json:"lag"`
}

type clusterJoinJSON struct {
	NodeID string `json:"node_id"`
	Added  bool   `json:"added"`
}

type clusterNodeIDJSON struct {
	NodeID string `json:"node_id"`
}

type clusterLeaderJSON struct {
	LeaderID string `json:"leader_id"`
}

type snapshotJSON struct {
	Index uint64 `json:"index"`
}

// printJSON prints v as one line of JSON.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (c *cli) jsonOutput() bool { return c.output == "json" }

func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// printFields prints label/value pairs as an aligned two-column table.
func printFields(w io.Writer, fields [][2]string) error {
	tw := newTable(w)
	for _, f := range fields {
		label := f[0]
		if label != "" {
			// An empty label continues the previous field on a new line.
			label += ":"
		}
		fmt.Fprintf(tw, "%s\t%s\n", label, f[1])
	}
	return tw.Flush()
}

// propertyFields are the lines of a message's properties, one per
// property, sorted by key; a line "-" when there is none.
func propertyFields(props map[string]string) [][2]string {
	if len(props) == 0 {
		return [][2]string{{"Properties", "-"}}
	}
	var fields [][2]string
	label := "Properties"
	for _, k := range sortedKeys(props) {
		fields = append(fields, [2]string{label, k + "=" + props[k]})
		label = ""
	}
	return fields
}

// printMessage prints a message's fields, then its body: below the table,
// where tabs and line breaks in it cannot disturb the alignment, as text
// or, when it is not UTF-8, base64; "-" in the table when empty.
func printMessage(w io.Writer, fields [][2]string, body []byte) error {
	if len(body) == 0 {
		return printFields(w, append(fields, [2]string{"Body", "-"}))
	}
	if err := printFields(w, fields); err != nil {
		return err
	}
	var err error
	if utf8.Valid(body) {
		_, err = fmt.Fprintf(w, "Body:\n%s\n", body)
	} else {
		_, err = fmt.Fprintf(w, "Body (base64):\n%s\n", base64.StdEncoding.EncodeToString(body))
	}
	return err
}

func stateName(s txmqv1.HalfState) string {
	return strings.TrimPrefix(s.String(), "HALF_STATE_")
}

func sourceName(s txmqv1.ResolutionSource) string {
	if s == txmqv1.ResolutionSource_RESOLUTION_SOURCE_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(s.String(), "RESOLUTION_SOURCE_")
}

// resolutionName is "COMMIT", "ROLLBACK" or "UNKNOWN", or "" when unset.
func resolutionName(r txmqv1.Resolution) string {
	if r == txmqv1.Resolution_RESOLUTION_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(r.String(), "RESOLUTION_")
}

// expiryName is "PARK" or "ROLLBACK", or "" when unset.
func expiryName(a txmqv1.ExpiryAction) string {
	if a == txmqv1.ExpiryAction_EXPIRY_ACTION_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(a.String(), "EXPIRY_ACTION_")
}

// poisonName is "SKIP" or "HOLD", or "" when unset.
func poisonName(p txmqv1.OrderedPoison) string {
	if p == txmqv1.OrderedPoison_ORDERED_POISON_UNSPECIFIED {
		return ""
	}
	return strings.TrimPrefix(p.String(), "ORDERED_POISON_")
}

// endpointText renders a producer's callback endpoint the way a group's
// callback URL is written: grpc://host:port, or the HTTP URL.
func endpointText(e *txmqv1.CallbackEndpoint) string {
	switch {
	case e.GetGrpcAddress() != "":
		return "grpc://" + e.GetGrpcAddress()
	case e.GetHttpUrl() != "":
		return e.GetHttpUrl()
	}
	return ""
}

// jsonDuration is a Go duration string such as "6s" or "1m0s", or "" when
// unset.
func jsonDuration(d *durationpb.Duration) string {
	if d == nil {
		return ""
	}
	return d.AsDuration().String()
}

// tableDuration is a Go duration string, or "-" when unset.
func tableDuration(d *durationpb.Duration) string {
	return orDash(jsonDuration(d))
}

func jsonTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return ""
	}
	return ts.AsTime().UTC().Format(time.RFC3339Nano)
}

// tableTime is RFC 3339 to the second, in UTC, or "-" when unset.
func tableTime(ts *timestamppb.Timestamp) string {
	if ts == nil {
		return "-"
	}
	return ts.AsTime().UTC().Format(time.RFC3339)
}

// tableBackoff renders a redelivery backoff schedule the way
// --redelivery-backoff reads it, or "-" when empty.
func tableBackoff(list []*durationpb.Duration) string {
	ds := make([]time.Duration, len(list))
	for i, d := range list {
		ds[i] = d.AsDuration()
	}
	return orDash(joinDurations(ds))
}

// lagAge is how old the oldest unacked message is, for a person: whole
// seconds without zero units ("3m12s", "2h", "1h5s"), or "-" when nothing
// is unacked.
func lagAge(lag uint64, age *durationpb.Duration) string {
	if lag == 0 || age == nil {
		return "-"
	}
	return humanDuration(age.AsDuration())
}

// humanDuration is d in hours, minutes and seconds, leaving out zero units;
// below a second it is d rounded to the millisecond.
func humanDuration(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	d = d.Truncate(time.Second)
	var b strings.Builder
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if n := d / u.unit; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
			d -= n * u.unit
		}
	}
	return b.String()
}

// orDash returns s, or "-" for an empty s, so table columns never collapse.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// tableCell renders free text, such as an error, as one table cell of at
// most width characters: runs of white space and control characters become one
// space, and a longer text is cut and ends in "...".
func tableCell(s string, width int) string {
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if utf8.RuneCountInString(s) <= width {
		return orDash(s)
	}
	runes := []rune(s)
	return strings.TrimRightFunc(string(runes[:width-3]), unicode.IsSpace) + "..."
}

// lineBody renders a body on one line: text as it is, text with line breaks
// or other control characters Go-quoted, anything else as base64.
func lineBody(b []byte) string {
	if !utf8.Valid(b) {
		return "base64:" + base64.StdEncoding.EncodeToString(b)
	}
	s := string(b)
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func sortedKeys(m map[string]string) []string {
	return slices.Sorted(maps.Keys(m))
}
