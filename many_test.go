package ratelimit_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

// batching is a BatchStore over memstore that records what reaches it, and
// fails the items whose key is in fail.
type batching struct {
	*memstore.Store
	batches [][]string
	applies int
	fail    map[string]bool
}

func (b *batching) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	b.applies++
	return b.Store.Apply(ctx, key, r)
}

func (b *batching) ApplyBatch(ctx context.Context, items []ratelimit.BatchItem) {
	var keys []string
	for i := range items {
		keys = append(keys, items[i].Key)
	}
	b.batches = append(b.batches, keys)
	b.Store.ApplyBatch(ctx, items)
	for i := range items {
		if b.fail[items[i].Key] {
			items[i].Decision, items[i].Err = ratelimit.Decision{}, errors.New("node down")
		}
	}
}

// want is the expected outcome of one item.
type want struct {
	allowed   bool
	remaining int64
	invalid   bool
	failed    bool
}

func checkResults(t *testing.T, res []ratelimit.Result, wants []want) {
	t.Helper()
	if len(res) != len(wants) {
		t.Fatalf("%d results, want %d", len(res), len(wants))
	}
	for i, w := range wants {
		r := res[i]
		switch {
		case w.invalid:
			if !errors.Is(r.Err, ratelimit.ErrInvalidArgument) {
				t.Errorf("item %d: err = %v, want ErrInvalidArgument", i, r.Err)
			}
		case w.failed:
			if r.Err == nil || errors.Is(r.Err, ratelimit.ErrInvalidArgument) {
				t.Errorf("item %d: err = %v, want the store's error", i, r.Err)
			}
		default:
			if r.Err != nil || r.Decision.Allowed != w.allowed || r.Decision.Remaining != w.remaining {
				t.Errorf("item %d = %+v, %v; want allowed=%v remaining=%d", i, r.Decision, r.Err, w.allowed, w.remaining)
			}
		}
	}
}

func TestTryAcquireMany(t *testing.T) {
	items := []ratelimit.Item[string]{
		{"a", 1},
		{"b", 2},
		{"a", 1},
		{"", 1},  // empty subject
		{"c", 0}, // cost below 1
		{"c", 3}, // cost above the capacity
		{"a", 1}, // a's third: denied
		{"b", 1},
	}
	wants := []want{
		{allowed: true, remaining: 1},
		{allowed: true, remaining: 0},
		{allowed: true, remaining: 0},
		{invalid: true},
		{invalid: true},
		{invalid: true},
		{allowed: false, remaining: 0},
		{allowed: false, remaining: 0},
	}
	ctx := context.Background()
	t.Run("a BatchStore gets the valid items in one call, in input order", func(t *testing.T) {
		store := &batching{Store: memstore.New()}
		l, _ := ratelimit.New[string](store, ratelimit.PerMinute(2), ratelimit.WithNamespace("n"))
		checkResults(t, l.TryAcquireMany(ctx, items), wants)
		got := strings.Join(store.batches[0], " ")
		if len(store.batches) != 1 || got != "1:n:a 1:n:b 1:n:a 1:n:a 1:n:b" || store.applies != 0 {
			t.Fatalf("the store got batches %q and %d single checks; want one batch of the five valid items", store.batches, store.applies)
		}
	})
	t.Run("any other store gets one Apply per valid item, in input order", func(t *testing.T) {
		rec := &recorder{}
		l, _ := ratelimit.New[string](rec, ratelimit.PerMinute(2), ratelimit.WithNamespace("n"))
		l.TryAcquireMany(ctx, items)
		if got := strings.Join(rec.keys, " "); got != "1:n:a 1:n:b 1:n:a 1:n:a 1:n:b" {
			t.Fatalf("the store got %q", got)
		}
		store := &countingStore{Store: memstore.New()}
		l, _ = ratelimit.New[string](store, ratelimit.PerMinute(2))
		checkResults(t, l.TryAcquireMany(ctx, items), wants)
	})
	t.Run("an item the store fails carries its error; the others are decided", func(t *testing.T) {
		store := &batching{Store: memstore.New(), fail: map[string]bool{"1:n:b": true}}
		l, _ := ratelimit.New[string](store, ratelimit.PerMinute(2), ratelimit.WithNamespace("n"))
		res := l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"a", 1}, {"b", 1}, {"c", 1}})
		checkResults(t, res, []want{{allowed: true, remaining: 1}, {failed: true}, {allowed: true, remaining: 1}})
	})
	t.Run("no items, no call", func(t *testing.T) {
		store := &batching{Store: memstore.New()}
		l, _ := ratelimit.New[string](store, ratelimit.PerMinute(2))
		if res := l.TryAcquireMany(ctx, nil); len(res) != 0 || len(store.batches) != 0 {
			t.Fatalf("TryAcquireMany(nil) = %v with %d batches", res, len(store.batches))
		}
		if res := l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"", 1}}); len(res) != 1 || len(store.batches) != 0 {
			t.Fatalf("a batch of one invalid item: %v with %d batches", res, len(store.batches))
		}
	})
	t.Run("the clock is read once, and every item is decided at that time", func(t *testing.T) {
		var reads atomic.Int64
		clock := testkit.NewClock(testkit.Start)
		store := &batching{Store: memstore.New()}
		l, _ := ratelimit.New[string](store, ratelimit.PerMinute(2), ratelimit.WithClock(func() time.Time {
			reads.Add(1)
			return clock.Now()
		}))
		l.TryAcquireMany(ctx, items)
		if reads.Load() != 1 {
			t.Fatalf("the clock was read %d times for one batch", reads.Load())
		}
	})
	t.Run("a cancelled context fails every item", func(t *testing.T) {
		l, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2))
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		for i, r := range l.TryAcquireMany(cctx, []ratelimit.Item[string]{{"a", 1}, {"b", 1}}) {
			if !errors.Is(r.Err, context.Canceled) {
				t.Errorf("item %d: err = %v, want context.Canceled", i, r.Err)
			}
		}
	})
	t.Run("the denial cache answers for its subjects and sends the rest", func(t *testing.T) {
		clock := testkit.NewClock(testkit.Start)
		store := &batching{Store: memstore.New(memstore.WithClock(clock.Now))}
		l, _ := ratelimit.New[string](store, ratelimit.PerMinute(1), ratelimit.WithNamespace("n"),
			ratelimit.WithClock(clock.Now), ratelimit.WithDenyCache(8))
		l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"hot", 1}, {"hot", 1}})
		clock.Add(time.Second)
		res := l.TryAcquireMany(ctx, []ratelimit.Item[string]{{"hot", 1}, {"cold", 1}, {"hot", 1}})
		if got := strings.Join(store.batches[1], " "); got != "1:n:cold" {
			t.Fatalf("the second batch sent %q, want only the cold subject", got)
		}
		for _, i := range []int{0, 2} {
			if d := res[i].Decision; d.Allowed || d.Source != ratelimit.SourceCache || d.RetryAfter != 59*time.Second {
				t.Errorf("item %d = %+v, want denied by the cache, retry after 59s", i, d)
			}
		}
		if d := res[1].Decision; !d.Allowed || d.Source != ratelimit.SourceStore {
			t.Errorf("item 1 = %+v, want allowed by the store", d)
		}
	})
}
