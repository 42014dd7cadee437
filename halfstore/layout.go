package halfstore

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	"github.com/txmq/txmq/halfstore/storepb"
)

// The on-disk layout, schema version 2 (meta.go: SchemaVersion, and the
// migrations from older versions). Every root bucket exists from the
// store's creation (or its migration) on, and every nested bucket of a
// topic or a consumer group with the topic or group, so that no reader
// checks for a missing one; a producer group's half_sched bucket exists
// while it has pending messages. Root buckets:
//
//	meta       "applied_index" -> uint64 BE (last Raft index applied)
//	           "schema_version" -> uint64 BE (SchemaVersion; absent: 0)
//	           "latest_stamp" -> int64 BE (latest time stamped into an
//	             applied command, Unix ns; absent: 0, no floor yet, so a
//	             store older than it needs no migration)
//	half       message ID -> storepb.Half (pending, resolved, tombstones)
//	half_tx    producer group 0x00 transaction ID -> message ID
//	half_state state byte | message ID -> 1 (index for listing by state)
//	half_sched one nested bucket per producer group with pending messages:
//	             next check time BE | message ID -> 1 (what is due, in order)
//	half_resolved resolved_at BE | message ID -> 1 (COMMITTED and ROLLED_BACK
//	             halves by resolution time, for pruning)
//	producer_groups name -> storepb.ProducerGroup (check-back policy)
//	consumer_groups name -> storepb.ConsumerGroup (delivery policy)
//	nodes      Raft server ID -> storepb.Node (where each member serves the API)
//	dedup      topic 0x00 key -> storepb.Dedup (Send dedup window)
//	dedup_time sent_at BE | topic 0x00 key -> 1 (dedup records by age, for
//	             pruning; one entry per dedup record)
//	dlq_ids    consumer group 0x00 message ID -> topic 0x00 sequence BE
//	             (dead letters by message ID)
//	topics     one nested bucket per topic:
//	             "meta"   -> storepb.Topic (first_sequence >= 1: the oldest
//	                         retained sequence, or the next to come)
//	             "log"    sequence BE -> storepb.Message (first_sequence..last_sequence)
//	             "groups" one nested bucket per consumer group:
//	                        "meta"    -> storepb.Group (counters match the buckets below)
//	                        "acked"   sequence BE -> 1 (acks above acked_through)
//	                        "retry"   sequence BE -> storepb.Retry (unacked log
//	                                  messages that failed at least once)
//	                        "dlq"     sequence BE -> storepb.DeadLetter
//	                        "redrive" sequence BE -> storepb.DeadLetter (redriven,
//	                                  not yet acked)
var (
	bktMeta      = []byte("meta")
	bktHalf      = []byte("half")
	bktHalfTx    = []byte("half_tx")
	bktHalfState = []byte("half_state")
	bktHalfRes   = []byte("half_resolved")
	bktDedup     = []byte("dedup")
	bktDedupTime = []byte("dedup_time")
	bktTopics    = []byte("topics")
	bktHalfSched = []byte("half_sched")
	bktPGroups   = []byte("producer_groups")
	bktCGroups   = []byte("consumer_groups")
	bktNodes     = []byte("nodes")
	bktDLQIDs    = []byte("dlq_ids")

	keyApplied       = []byte("applied_index")
	keySchemaVersion = []byte("schema_version")
	keyStamp         = []byte("latest_stamp")
	keyMeta          = []byte("meta")
	bktLog           = []byte("log")
	bktGroups        = []byte("groups")
	bktAcked         = []byte("acked")
	bktRetry         = []byte("retry")
	bktDLQ           = []byte("dlq")
	bktRedrive       = []byte("redrive")
)

// createRoots creates the root buckets of a new store, and of one migrated
// to version 1 (the first version; a later one that changes the roots must
// give that migration its own list).
func createRoots(btx *bolt.Tx) error {
	for _, name := range [][]byte{
		bktMeta, bktHalf, bktHalfTx, bktHalfState, bktHalfRes, bktDedup, bktDedupTime,
		bktTopics, bktHalfSched, bktPGroups, bktCGroups, bktNodes, bktDLQIDs,
	} {
		if _, err := btx.CreateBucketIfNotExists(name); err != nil {
			return err
		}
	}
	return nil
}

// Tx is one bbolt transaction seen through txmq's buckets. Write methods are
// only valid inside Store.Update.
type Tx struct {
	tx *bolt.Tx
}

// present is the value of index entries whose key says everything: bbolt
// reads a key stored with an empty value back as nil within the writing
// transaction, which would make "is it there?" depend on batching.
var present = []byte{1}

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func txKey(group, txID string) []byte {
	return []byte(group + "\x00" + txID)
}

func stateKey(st storepb.HalfState, id string) []byte {
	return append([]byte{byte(st)}, id...)
}

func dedupTimeKey(sentAt int64, dk []byte) []byte {
	return append(u64(uint64(sentAt)), dk...)
}

func schedKey(at int64, id string) []byte {
	return append(u64(uint64(at)), id...)
}

func dlqIDKey(group, messageID string) []byte {
	return []byte(group + "\x00" + messageID)
}

func put(b *bolt.Bucket, key []byte, m proto.Message) error {
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(key, v)
}

func get(b *bolt.Bucket, key []byte, m proto.Message) (bool, error) {
	v := b.Get(key)
	if v == nil {
		return false, nil
	}
	if err := proto.Unmarshal(v, m); err != nil {
		return true, fmt.Errorf("halfstore: corrupt record %q: %w", key, err)
	}
	return true, nil
}

// maxName bounds names and keys that become bbolt keys (bbolt's own limit
// is 32 KiB). The broker's limits are tighter; this keeps the FSM from
// failing on a command that slipped past them.
const maxName = 4096

func checkName(kind, name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("%w: %s must be 1 to %d bytes", ErrInvalid, kind, maxName)
	}
	return nil
}
