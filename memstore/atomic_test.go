package memstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

func item(key string, cost int64, limits ...ratelimit.Limit) ratelimit.BatchItem {
	return ratelimit.BatchItem{Key: key, Request: ratelimit.Request{Limits: limits, Cost: cost}}
}

func peekItem(key string, limits ...ratelimit.Limit) ratelimit.BatchItem {
	return ratelimit.BatchItem{Key: key, Request: ratelimit.Request{Limits: limits, Peek: true}}
}

// balance returns the tokens left in key's bucket under limits, by a peek.
func balance(t *testing.T, s *memstore.Store, key string, limits ...ratelimit.Limit) int64 {
	t.Helper()
	d, err := s.Apply(context.Background(), key, ratelimit.Request{Limits: limits, Peek: true})
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

func TestApplyAllIsAllOrNothing(t *testing.T) {
	ten := ratelimit.PerHour(10)
	three := ratelimit.PerHour(3)
	type want struct {
		allowed   bool
		remaining int64
	}
	for _, tc := range []struct {
		name  string
		spent map[string]int64 // taken from each key beforehand
		items []ratelimit.BatchItem
		want  []want
		after map[string]int64 // balance of each key afterwards
	}{
		{
			name:  "every bucket holds its cost: each is taken",
			spent: map[string]int64{"2:ns:a": 4},
			items: []ratelimit.BatchItem{item("2:ns:a", 6, ten), item("2:ns:b", 2, ten)},
			want:  []want{{true, 0}, {true, 8}},
			after: map[string]int64{"2:ns:a": 0, "2:ns:b": 8},
		},
		{
			name:  "one bucket short: nothing is taken from any",
			spent: map[string]int64{"2:ns:a": 5},
			items: []ratelimit.BatchItem{item("2:ns:a", 6, ten), item("2:ns:b", 2, ten), item("2:ns:c", 1, ten)},
			want:  []want{{false, 5}, {true, 10}, {true, 10}},
			after: map[string]int64{"2:ns:a": 5, "2:ns:b": 10, "2:ns:c": 10},
		},
		{
			name:  "the last of many items short: nothing is taken",
			spent: map[string]int64{"1:x:k9": 10},
			items: func() []ratelimit.BatchItem {
				var items []ratelimit.BatchItem
				for i := range 10 {
					items = append(items, item(fmt.Sprint("1:x:k", i), 1, ten))
				}
				return items
			}(),
			want:  []want{{true, 10}, {true, 10}, {true, 10}, {true, 10}, {true, 10}, {true, 10}, {true, 10}, {true, 10}, {true, 10}, {false, 0}},
			after: map[string]int64{"1:x:k0": 10, "1:x:k5": 10, "1:x:k9": 0},
		},
		{
			name:  "an empty peek stops the others too: each item needs its bucket's standing",
			spent: map[string]int64{"2:ns:p": 10},
			items: []ratelimit.BatchItem{item("2:ns:a", 1, ten), peekItem("2:ns:p", ten)},
			want:  []want{{true, 10}, {false, 0}},
			after: map[string]int64{"2:ns:a": 10, "2:ns:p": 0},
		},
		{
			name:  "a peek takes nothing when the others are taken",
			items: []ratelimit.BatchItem{peekItem("2:ns:p", ten), item("2:ns:a", 3, ten)},
			want:  []want{{true, 10}, {true, 7}},
			after: map[string]int64{"2:ns:p": 10, "2:ns:a": 7},
		},
		{
			name:  "items of different policies and namespaces, and a key with no namespace",
			spent: map[string]int64{"plain": 1},
			items: []ratelimit.BatchItem{item("plain", 2, three), item("2:ns:a", 3, ten), item("5:other:a", 3, three)},
			want:  []want{{true, 0}, {true, 7}, {true, 0}},
			after: map[string]int64{"plain": 0, "2:ns:a": 7, "5:other:a": 0},
		},
		{
			name:  "one limit of a policy of two short: nothing is taken",
			spent: map[string]int64{"2:ns:m": 2},
			items: []ratelimit.BatchItem{item("2:ns:m", 2, ten, three), item("2:ns:a", 1, ten)},
			want:  []want{{false, 1}, {true, 10}},
			after: map[string]int64{"2:ns:a": 10},
		},
		{
			name:  "a single item is Apply",
			items: []ratelimit.BatchItem{item("2:ns:a", 10, ten)},
			want:  []want{{true, 0}},
			after: map[string]int64{"2:ns:a": 0},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := memstore.New(memstore.WithClock(testkit.NewClock(testkit.Start).Now))
			for key, n := range tc.spent {
				limits := []ratelimit.Limit{ten}
				if key == "plain" || key == "2:ns:m" {
					limits = []ratelimit.Limit{three}
				}
				if d, err := s.Apply(ctx, key, ratelimit.Request{Limits: limits, Cost: n}); err != nil || !d.Allowed {
					t.Fatalf("spending %d of %q: %+v, %v", n, key, d, err)
				}
			}
			if err := s.ApplyAll(ctx, tc.items); err != nil {
				t.Fatal(err)
			}
			for i, w := range tc.want {
				d := tc.items[i].Decision
				if d.Allowed != w.allowed || d.Remaining != w.remaining {
					t.Errorf("item %d (%s) = {allowed:%v remaining:%d}, want {allowed:%v remaining:%d}",
						i, tc.items[i].Key, d.Allowed, d.Remaining, w.allowed, w.remaining)
				}
			}
			for key, n := range tc.after {
				limits := []ratelimit.Limit{ten}
				if key == "plain" || key == "5:other:a" {
					limits = []ratelimit.Limit{three}
				}
				if got := balance(t, s, key, limits...); got != n {
					t.Errorf("%q holds %d after the batch, want %d", key, got, n)
				}
			}
		})
	}
}

func TestApplyAllRefusesBadBatchesWholly(t *testing.T) {
	ten := ratelimit.PerHour(10)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name  string
		ctx   context.Context
		items []ratelimit.BatchItem
		want  error
	}{
		{"an item costs more than its capacity", context.Background(),
			[]ratelimit.BatchItem{item("2:ns:a", 1, ten), item("2:ns:b", 11, ten)}, ratelimit.ErrInvalidArgument},
		{"an item has no limits", context.Background(),
			[]ratelimit.BatchItem{item("2:ns:a", 1, ten), item("2:ns:b", 1)}, ratelimit.ErrInvalidArgument},
		{"two items share a key", context.Background(),
			[]ratelimit.BatchItem{item("2:ns:a", 1, ten), item("2:ns:b", 1, ten), item("2:ns:a", 1, ten)}, ratelimit.ErrInvalidArgument},
		{"the items' times differ", context.Background(),
			[]ratelimit.BatchItem{item("2:ns:a", 1, ten), {Key: "2:ns:b", Request: ratelimit.Request{Limits: []ratelimit.Limit{ten}, Cost: 1, Now: testkit.Start}}}, ratelimit.ErrInvalidArgument},
		{"an item's time is before the epoch", context.Background(),
			[]ratelimit.BatchItem{{Key: "2:ns:b", Request: ratelimit.Request{Limits: []ratelimit.Limit{ten}, Cost: 1, Now: time.Unix(-1, 0)}}}, ratelimit.ErrInvalidArgument},
		{"the context is cancelled", cancelled,
			[]ratelimit.BatchItem{item("2:ns:a", 1, ten)}, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := memstore.New(memstore.WithClock(testkit.NewClock(testkit.Start).Now))
			if err := s.ApplyAll(tc.ctx, tc.items); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if s.Len() != 0 {
				t.Fatalf("a refused batch left %d buckets", s.Len())
			}
		})
	}
	s := memstore.New()
	if err := s.ApplyAll(context.Background(), nil); err != nil {
		t.Fatalf("an empty batch: %v", err)
	}
}

// TestApplyAllEqualsStep holds ApplyAll equal to tokenbucket.StepAll, the pure
// all-or-nothing step, on random batches over buckets kept by a model.
func TestApplyAllEqualsStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	clock := testkit.NewClock(testkit.Start)
	s := memstore.New(memstore.WithClock(clock.Now))
	ctx := context.Background()
	keys := randomKeys()
	model := map[string]tokenbucket.State{}
	allowedBatches := 0
	for round := range 3000 {
		clock.Add(time.Duration(rng.IntN(300_000)) * time.Microsecond)
		us := clock.Now().UnixMicro()
		n := 1 + rng.IntN(6)
		perm := rng.Perm(len(keys))[:n]
		items := make([]ratelimit.BatchItem, n)
		rs := make([]ratelimit.Request, n)
		sts := make([]*tokenbucket.State, n)
		for i, k := range perm {
			limits := randomPolicies[rng.IntN(len(randomPolicies))]
			minCap := limits[0].Capacity
			for _, l := range limits {
				minCap = min(minCap, l.Capacity)
			}
			rs[i] = ratelimit.Request{Limits: limits, Cost: 1 + rng.Int64N(minCap), Peek: rng.IntN(8) == 0}
			items[i] = ratelimit.BatchItem{Key: keys[k], Request: rs[i]}
			st := model[keys[k]]
			sts[i] = &tokenbucket.State{Last: st.Last, Bands: append([]tokenbucket.Band(nil), st.Bands...)}
		}
		want := make([]ratelimit.Decision, n)
		if tokenbucket.StepAll(sts, rs, us, want, make([]time.Duration, n)) {
			allowedBatches++
			for i, it := range items {
				model[it.Key] = *sts[i]
			}
		}
		if err := s.ApplyAll(ctx, items); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for i, it := range items {
			if !reflect.DeepEqual(it.Decision, want[i]) {
				t.Fatalf("round %d, item %d (%q, %v, cost %d, peek %v) = %+v, StepAll says %+v",
					round, i, it.Key, it.Request.Limits, it.Request.Cost, it.Request.Peek, it.Decision, want[i])
			}
		}
	}
	if allowedBatches < 300 || allowedBatches > 2700 {
		t.Fatalf("%d of 3000 batches were taken: the test should see both outcomes often", allowedBatches)
	}
}

// TestApplyAllAgainstApply runs ApplyAll on two keys against Apply on each
// of them, at once: no bucket ever gives more than it holds, and every token
// is accounted for.
func TestApplyAllAgainstApply(t *testing.T) {
	const capacity = 300
	limit := ratelimit.PerHour(capacity)
	s := memstore.New(memstore.WithClock(testkit.NewClock(testkit.Start).Now))
	ctx := context.Background()
	keys := []string{"2:ns:a", "2:ns:b"}
	var mu sync.Mutex
	taken := map[string]int64{}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				if g%2 == 0 {
					items := []ratelimit.BatchItem{item(keys[0], 1, limit), item(keys[1], 2, limit)}
					if err := s.ApplyAll(ctx, items); err != nil {
						t.Error(err)
						return
					}
					if items[0].Decision.Allowed && items[1].Decision.Allowed {
						mu.Lock()
						taken[keys[0]]++
						taken[keys[1]] += 2
						mu.Unlock()
					}
					continue
				}
				key := keys[(g/2+i)%2]
				d, err := s.Apply(ctx, key, ratelimit.Request{Limits: []ratelimit.Limit{limit}, Cost: 1})
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					taken[key]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	for _, key := range keys {
		left := balance(t, s, key, limit)
		if taken[key]+left != capacity {
			t.Errorf("%q: %d taken and %d left, want %d in all", key, taken[key], left, capacity)
		}
	}
}
