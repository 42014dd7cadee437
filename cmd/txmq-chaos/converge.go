package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
)

// converge waits until every node has applied the same index and its log
// ends at the same index, stops the nodes, and compares their stores
// bucket by bucket. It reports whether they are identical, and how they
// differ (or what they agree on).
func (x *Chaos) converge(ctx context.Context) (bool, string) {
	var applied []uint64
	err := retry(ctx, 60*time.Second, func() error {
		applied = applied[:0]
		var last []uint64
		for _, id := range x.c.IDs() {
			st, err := x.c.Status(ctx, id, true)
			if err != nil {
				return err
			}
			applied = append(applied, st.GetStoreAppliedIndex())
			last = append(last, st.GetLastLogIndex())
		}
		for i := range applied {
			if applied[i] != applied[0] || last[i] != last[0] {
				return fmt.Errorf("applied %v, last log index %v", applied, last)
			}
		}
		return nil
	})
	for _, id := range x.c.IDs() {
		x.c.Stop(id)
	}
	if err != nil {
		return false, "the nodes did not reach the same index within 60 s: " + err.Error()
	}
	var dumps []map[string][32]byte
	for _, id := range x.c.IDs() {
		d, err := dumpStore(filepath.Join(x.c.StoreDir(id), "fsm.db"))
		if err != nil {
			return false, fmt.Sprintf("%s: %v", id, err)
		}
		dumps = append(dumps, d)
	}
	for i, d := range dumps[1:] {
		if diff := diffDumps(dumps[0], d); diff != "" {
			return false, fmt.Sprintf("n1 and %s differ: %s", x.c.IDs()[i+1], diff)
		}
	}
	return true, fmt.Sprintf("every node applied through index %d; their stores hold the same %d buckets", applied[0], len(dumps[0]))
}

// dumpStore hashes every bucket of a bbolt file, nested ones included, by
// path: its keys and values in order.
func dumpStore(path string) (map[string][32]byte, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: 5 * time.Second})
	if err != nil {
		return nil, err
	}
	defer db.Close()
	out := map[string][32]byte{}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
			return hashBucket(out, string(name), b)
		})
	})
	return out, err
}

func hashBucket(out map[string][32]byte, path string, b *bolt.Bucket) error {
	h := sha256.New()
	var n [8]byte
	err := b.ForEach(func(k, v []byte) error {
		binary.BigEndian.PutUint64(n[:], uint64(len(k)))
		h.Write(n[:])
		h.Write(k)
		if v == nil {
			return hashBucket(out, path+"/"+string(k), b.Bucket(k))
		}
		binary.BigEndian.PutUint64(n[:], uint64(len(v)))
		h.Write(n[:])
		h.Write(v)
		return nil
	})
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	out[path] = sum
	return err
}

// diffDumps names the buckets that differ, or "" when none do.
func diffDumps(a, b map[string][32]byte) string {
	var diff []string
	for k, v := range a {
		if w, ok := b[k]; !ok {
			diff = append(diff, k+" missing")
		} else if !bytes.Equal(v[:], w[:]) {
			diff = append(diff, k+" differs")
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diff = append(diff, k+" extra")
		}
	}
	return strings.Join(diff, ", ")
}
