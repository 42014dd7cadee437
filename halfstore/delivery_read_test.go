package halfstore

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/txmq/txmq/halfstore/storepb"
)

func readGroupLog(t *testing.T, s *Store, topic, group string, from uint64, limit int) []GroupMessage {
	t.Helper()
	var out []GroupMessage
	view(t, s, func(tx *Tx) error {
		var err error
		out, err = tx.ReadGroupLog(topic, group, from, limit)
		return err
	})
	return out
}

// ReadGroupLog gives what ReadTopic and one Retry per message give, for
// every window of the log, with retry records before, inside and after it,
// of this group and of another.
func TestReadGroupLogMatchesRetryLookups(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "a", "", "b", "a", "", "c", "", "b")
	createGroup(t, s, "orders", "g", GroupStart{})
	createGroup(t, s, "orders", "other", GroupStart{})
	_, err := fail(t, s, "orders", "g", t0+10*sec, retryOf(2, 1), retryOf(3, 2), retryOf(5, 1), retryOf(8, 4))
	require.NoError(t, err)
	_, err = fail(t, s, "orders", "other", t0+10*sec, retryOf(4, 1), retryOf(6, 3))
	require.NoError(t, err)
	// Acked: its retry state is gone. Dead: acked, and in the DLQ instead.
	require.NoError(t, ack(t, s, "orders", "g", 3))
	_, err = fail(t, s, "orders", "g", t0+11*sec, deadOf(5, 2))
	require.NoError(t, err)

	withRetry := 0
	for _, group := range []string{"g", "other"} {
		for from := uint64(0); from <= 9; from++ {
			for limit := 1; limit <= 9; limit++ {
				got := readGroupLog(t, s, "orders", group, from, limit)
				var want []GroupMessage
				view(t, s, func(tx *Tx) error {
					msgs, err := tx.ReadTopic("orders", from, limit)
					if err != nil {
						return err
					}
					for _, m := range msgs {
						r, err := tx.Retry("orders", group, m.Sequence)
						if err != nil {
							return err
						}
						want = append(want, GroupMessage{Message: m, Retry: r})
					}
					return nil
				})
				require.Len(t, got, len(want), "%s from %d limit %d", group, from, limit)
				for i := range want {
					where := fmt.Sprintf("%s from %d limit %d, message %d", group, from, limit, i)
					protoEq(t, want[i].Message, got[i].Message, where)
					require.Equal(t, want[i].Retry == nil, got[i].Retry == nil, where)
					if want[i].Retry != nil {
						protoEq(t, want[i].Retry, got[i].Retry, where)
						withRetry++
					}
				}
			}
		}
	}
	require.Positive(t, withRetry, "some windows hold retry records")

	all := readGroupLog(t, s, "orders", "g", 1, 100)
	require.Len(t, all, 8)
	var failed []uint64
	for _, gm := range all {
		if gm.Retry != nil {
			failed = append(failed, gm.Message.Sequence)
		}
	}
	require.Equal(t, []uint64{2, 8}, failed, "3 acked, 5 dead, 4 and 6 failed in the other group")
	protoEq(t, &storepb.Retry{Attempts: 4, RetryAt: t0 + 4*sec, LastError: "attempt 4 failed"}, all[7].Retry)
	require.Empty(t, readGroupLog(t, s, "orders", "g", 9, 10), "past the end")
}

func TestReadGroupLogRefusals(t *testing.T) {
	s := openStore(t)
	sendKeyed(t, s, "orders", "")
	createGroup(t, s, "orders", "g", GroupStart{})
	view(t, s, func(tx *Tx) error {
		_, err := tx.ReadGroupLog("orders", "g", 1, 0)
		require.ErrorIs(t, err, ErrInvalid)
		_, err = tx.ReadGroupLog("orders", "nobody", 1, 10)
		require.ErrorIs(t, err, ErrNotFound)
		_, err = tx.ReadGroupLog("nope", "g", 1, 10)
		require.ErrorIs(t, err, ErrNotFound)
		return nil
	})
}

// A batch of 256 log messages of which every fourth failed before: one
// range read of the retry bucket against one Retry lookup per message.
func BenchmarkReadGroupLog(b *testing.B) {
	s := openAt(b, filepath.Join(b.TempDir(), "txmq.db"))
	const n = 256
	var fs []Failure
	update(b, s, func(tx *Tx) error {
		if _, _, err := tx.CreateTopic("orders", t0); err != nil {
			return err
		}
		for i := 1; i <= n; i++ {
			m := &storepb.Message{Id: fmt.Sprint(i), Body: make([]byte, 256)}
			if _, _, err := tx.Send("orders", m, false, 0, t0); err != nil {
				return err
			}
			if i%4 == 0 {
				fs = append(fs, Failure{Seq: uint64(i), Attempts: 1, RetryAt: t0, Error: "boom"})
			}
		}
		if _, _, err := tx.CreateGroup("orders", "g", GroupStart{}, t0, false); err != nil {
			return err
		}
		_, _, err := tx.RecordFailures("orders", "g", fs, t0)
		return err
	})
	b.Run("range", func(b *testing.B) {
		for b.Loop() {
			view(b, s, func(tx *Tx) error {
				out, err := tx.ReadGroupLog("orders", "g", 1, n)
				if len(out) != n {
					return fmt.Errorf("read %d", len(out))
				}
				return err
			})
		}
	})
	b.Run("lookup-each", func(b *testing.B) {
		for b.Loop() {
			view(b, s, func(tx *Tx) error {
				msgs, err := tx.ReadTopic("orders", 1, n)
				if err != nil {
					return err
				}
				retries := make([]*storepb.Retry, len(msgs))
				for i, m := range msgs {
					if retries[i], err = tx.Retry("orders", "g", m.Sequence); err != nil {
						return err
					}
				}
				return nil
			})
		}
	})
}
