package redisstore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// TestApplyAll checks all or nothing on a single server and on Cluster, with
// keys of one slot and of several, against StepAll.
func TestApplyAll(t *testing.T) {
	_, single := standalone(t)
	cluster := redistest.StartCluster(t, 3, 0)
	cc := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { cc.Close() })
	stores := map[string]*redisstore.Store{"standalone": redisstore.New(single), "cluster": redisstore.New(cc)}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			now := testkit.Start
			perIP, perRoute := []ratelimit.Limit{ratelimit.PerSecond(3)}, []ratelimit.Limit{ratelimit.PerMinute(5), ratelimit.PerDay(100)}
			keys := []string{"2:ip:1.2.3.4", "5:route:/api", "2:ip:{tag}a", "2:ip:{tag}b"}
			item := func(key string, limits []ratelimit.Limit, cost int64) ratelimit.BatchItem {
				return ratelimit.BatchItem{Key: key, Request: ratelimit.Request{Limits: limits, Cost: cost, Now: now}}
			}
			var pure [4]tokenbucket.State
			check := func(what string, items []ratelimit.BatchItem, idx []int, wantAll bool) {
				t.Helper()
				if err := store.ApplyAll(ctx, items); err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				sts := make([]*tokenbucket.State, len(items))
				rs := make([]ratelimit.Request, len(items))
				for i, it := range items {
					sts[i], rs[i] = &pure[idx[i]], it.Request
				}
				ds := make([]ratelimit.Decision, len(items))
				all := tokenbucket.StepAll(sts, rs, now.UnixMicro(), ds, make([]time.Duration, len(items)))
				if all != wantAll {
					t.Fatalf("%s: StepAll says %v, want %v", what, all, wantAll)
				}
				for i, it := range items {
					if !reflect.DeepEqual(it.Decision, ds[i]) {
						t.Fatalf("%s: item %d = %+v, StepAll %+v", what, i, it.Decision, ds[i])
					}
				}
			}
			for _, k := range keys {
				store.Reset(ctx, k)
			}
			// Slots apart (on Cluster): two steps; one slot: one call.
			for _, idx := range [][]int{{0, 1}, {2, 3}} {
				a, b := keys[idx[0]], keys[idx[1]]
				check("both take", []ratelimit.BatchItem{item(a, perIP, 2), item(b, perRoute, 1)}, idx, true)
				// The first holds 1 of 2: neither is charged.
				check("one short", []ratelimit.BatchItem{item(a, perIP, 2), item(b, perRoute, 1)}, idx, false)
				check("a peek and a take", []ratelimit.BatchItem{{Key: a, Request: ratelimit.Request{Limits: perIP, Peek: true, Now: now}}, item(b, perRoute, 4)}, idx, true)
				check("the route is empty", []ratelimit.BatchItem{item(a, perIP, 1), item(b, perRoute, 1)}, idx, false)
			}
			// Invalid input reaches no server.
			if err := store.ApplyAll(ctx, []ratelimit.BatchItem{item("k", perIP, 1), item("k", perIP, 1)}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Fatalf("a key twice: %v", err)
			}
			if err := store.ApplyAll(ctx, []ratelimit.BatchItem{item("k", perIP, 4)}); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Fatalf("cost above capacity: %v", err)
			}
		})
	}
}

// TestApplyAllUnderConcurrency: requests on two buckets at once, from many
// goroutines, never admit more than the smaller bucket, and each admitted
// request was charged by both: with the default lanes, and through one lane,
// where most requests wait and share script calls.
func TestApplyAllUnderConcurrency(t *testing.T) {
	for name, opts := range map[string][]redisstore.Option{"default lanes": nil, "one lane": {redisstore.WithLanes(1)}} {
		t.Run(name, func(t *testing.T) { testApplyAllUnderConcurrency(t, opts...) })
	}
}

func testApplyAllUnderConcurrency(t *testing.T, opts ...redisstore.Option) {
	_, client := standalone(t)
	store := redisstore.New(client, opts...)
	ctx := context.Background()
	small, big := []ratelimit.Limit{ratelimit.PerMinute(50)}, []ratelimit.Limit{ratelimit.PerMinute(80)}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 20 {
				items := []ratelimit.BatchItem{
					{Key: "conc:small", Request: ratelimit.Request{Limits: small, Cost: 1}},
					{Key: "conc:big", Request: ratelimit.Request{Limits: big, Cost: 1}},
				}
				if rng.IntN(2) == 0 {
					items[0], items[1] = items[1], items[0]
				}
				if err := store.ApplyAll(ctx, items); err != nil {
					t.Error(err)
					return
				}
				if items[0].Decision.Allowed && items[1].Decision.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != 50 {
		t.Fatalf("admitted %d of 640 requests, want exactly the smaller bucket's 50", got)
	}
	d, err := store.Apply(ctx, "conc:big", ratelimit.Request{Limits: big, Peek: true})
	if err != nil || d.Remaining < 30 || d.Remaining > 31 {
		t.Fatalf("the big bucket after 50 admissions: %+v %v, want 30 left (31 if a second refilled one)", d, err)
	}
}
