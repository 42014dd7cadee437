package dbtest

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	txmq "github.com/txmq/txmq/client/go"
)

const recordDDL = `CREATE TABLE consumer_record (
	consumer_group VARCHAR(127) NOT NULL,
	message_id     VARCHAR(64)  NOT NULL,
	processed_at   TIMESTAMP    NOT NULL DEFAULT CURRENT_TIMESTAMP,
	PRIMARY KEY (consumer_group, message_id)
)`

// The same message handled 50 times at once, by 5 goroutines, changes the
// business state once, on every database; through a *sql.DB, a held
// *sql.Conn and a transaction the caller owns alike. An attempt that fails
// (a lock timeout or deadlock the database chose to report) is tried
// again, as the broker would redeliver it.
func TestProcessOnceConcurrentDuplicates(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testDB) {
		db := d.open(t)
		exec(t, db, recordDDL, `CREATE TABLE balance (user_id VARCHAR(64) PRIMARY KEY, points BIGINT NOT NULL)`,
			`INSERT INTO balance (user_id, points) VALUES ('alice', 0)`)
		opts := []txmq.OnceOption{txmq.WithDialect(d.dialect)}
		add := func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE balance SET points = points + 120 WHERE user_id = 'alice'`)
			return err
		}
		ways := map[string]func(ctx context.Context, del *txmq.Delivery) (bool, error){
			"db": func(ctx context.Context, del *txmq.Delivery) (bool, error) {
				return txmq.ProcessOnce(ctx, db, del, add, opts...)
			},
			"conn": func(ctx context.Context, del *txmq.Delivery) (bool, error) {
				conn, err := db.Conn(ctx)
				if err != nil {
					return false, err
				}
				defer conn.Close()
				return txmq.ProcessOnce(ctx, conn, del, add, opts...)
			},
			"tx": func(ctx context.Context, del *txmq.Delivery) (bool, error) {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return false, err
				}
				defer tx.Rollback()
				applied, err := txmq.ProcessOnceInTx(ctx, tx, del, func(ctx context.Context) error { return add(ctx, tx) }, opts...)
				if err != nil {
					return false, err
				}
				return applied, tx.Commit()
			},
		}
		for _, way := range []string{"db", "conn", "tx"} {
			del := &txmq.Delivery{MessageID: "msg-" + way, Group: "points", Body: []byte("120")}
			var applied, retried atomic.Int64
			var lastErr atomic.Value
			var wg sync.WaitGroup
			for range 5 {
				wg.Go(func() {
					for range 10 {
						// Bounded: a database that keeps failing fails the test.
						for range 100 {
							ok, err := ways[way](t.Context(), del)
							if err != nil {
								retried.Add(1)
								lastErr.Store(err.Error())
								continue
							}
							if ok {
								applied.Add(1)
							}
							break
						}
					}
				})
			}
			wg.Wait()
			require.Less(t, retried.Load(), int64(100), "%s: last error %v", way, lastErr.Load())
			require.Equal(t, int64(1), applied.Load(), "%s: applied once of 50", way)
			t.Logf("%s via %s: 50 deliveries, applied 1, attempts retried after an error %d", d.name, way, retried.Load())
		}
		require.Equal(t, int64(3*120), queryInt(t, db, d.dialect, `SELECT points FROM balance WHERE user_id = ?`, "alice"))
		require.Equal(t, int64(3), queryInt(t, db, d.dialect, `SELECT COUNT(*) FROM consumer_record`))
	})
}
