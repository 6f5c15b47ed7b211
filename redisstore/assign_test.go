package redisstore_test

import (
	"context"
	"maps"
	"strconv"
	"testing"

	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/redisstore"
)

// TestAssignmentsWhenTheLogForgets: a cursor whose entry the log no longer
// holds (trimmed, or a server that lost its data) lists the whole set, so
// that a reader never misses a change, a removal included.
func TestAssignmentsWhenTheLogForgets(t *testing.T) {
	ctx := context.Background()
	srv, client := standalone(t)
	store := redisstore.New(client)
	hash, log := keyfmt.Assignments("api")
	for _, k := range []string{hash, log} {
		if slot := keyfmt.Slot(k); slot != keyfmt.Slot(hash) {
			t.Fatalf("%s is in slot %d, %s in %d; want one slot", k, slot, hash, keyfmt.Slot(hash))
		}
	}
	mustAssign := func(subject, value string) {
		t.Helper()
		if _, err := store.Assign(ctx, "api", subject, value); err != nil {
			t.Fatal(err)
		}
	}
	since := func(cursor string, want map[string]string, wantFull bool) string {
		t.Helper()
		changes, next, full, err := store.AssignmentsSince(ctx, "api", cursor)
		if err != nil || full != wantFull || !maps.Equal(changes, want) {
			t.Fatalf("AssignmentsSince(%q) = %v, %q, full %v, %v; want %v, full %v", cursor, changes, next, full, err, want, wantFull)
		}
		return next
	}
	mustAssign("a", "p:pro")
	mustAssign("b", "p:pro")
	cursor := since("", map[string]string{"a": "p:pro", "b": "p:pro"}, true)
	mustAssign("a", "")
	// Trim the log to its latest entry: the cursor's entry is gone.
	if err := client.XTrimMaxLen(ctx, log, 1).Err(); err != nil {
		t.Fatal(err)
	}
	cursor = since(cursor, map[string]string{"b": "p:pro"}, true)
	since(cursor, map[string]string{}, false)
	// The server restarts empty: everything assigned is gone.
	srv.Restart(t)
	since(cursor, map[string]string{}, true)
}

// TestAssignmentMemory measures what assignments cost Redis: the hash
// holding them and the log of their changes, by MEMORY USAGE (every
// element counted), for 100 and for 10,000 subjects of 12 bytes, each
// assigned once a plan ("p:pro") or a policy of its own (500 a second, 28
// bytes). docs/plans.md quotes the figures.
func TestAssignmentMemory(t *testing.T) {
	ctx := context.Background()
	_, client := standalone(t)
	store := redisstore.New(client)
	for _, tc := range []struct {
		n     int
		value string
	}{{100, "p:pro"}, {10_000, "p:pro"}, {100, `c:{"l":[[500,500,1000000]]}`}, {10_000, `c:{"l":[[500,500,1000000]]}`}} {
		n := tc.n
		ns := "mem" + strconv.Itoa(n) + tc.value[:1]
		for i := range n {
			if _, err := store.Assign(ctx, ns, "user:"+strconv.Itoa(10_000_000 + i)[1:], tc.value); err != nil {
				t.Fatal(err)
			}
		}
		hash, log := keyfmt.Assignments(ns)
		h, err := client.MemoryUsage(ctx, hash, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		l, err := client.MemoryUsage(ctx, log, 0).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, err := client.HLen(ctx, hash).Result(); err != nil || got != int64(n) {
			t.Fatalf("the hash holds %d subjects, %v; want %d", got, err, n)
		}
		t.Logf("FIGURE %d assignments of %q: hash %d bytes (%.1f each), log %d bytes (%.1f each)", n, tc.value, h, float64(h)/float64(n), l, float64(l)/float64(n))
		if per := (h + l) / int64(n); per > 200 {
			t.Fatalf("%d bytes per assignment, hash and log; want at most 200", per)
		}
	}
}
