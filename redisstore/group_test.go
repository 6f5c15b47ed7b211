package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
)

// groupsOf returns the number of groups a call of mode carries.
func groupsOf(mode string, keys int) int {
	switch mode {
	case script.Each:
		return keys
	case script.All:
		return 1
	}
	return strings.Count(mode, ",") + 1
}

// TestGroupsInOneCallAreDecidedAsApplyAllOneByOne sends the same random
// all-or-nothing groups (keys named in several groups, peeks, a cost per
// limit, denials, policy changes, a malformed bucket, several times, a group
// of more than 16 keys) to one server as the coalescer sends a queue of them,
// in shared script calls, and to another as one ApplyAll each, in order, and
// wants every decision and error equal; and calls of at most 16 keys that
// never split a group, fewer than the groups.
func TestGroupsInOneCallAreDecidedAsApplyAllOneByOne(t *testing.T) {
	srv, batchClient := standalone(t)
	_, singleClient := standalone(t)
	ctx := context.Background()
	hooked, hook := hookedClient(t, srv)
	batched, single := redisstore.New(hooked), redisstore.New(singleClient)
	policies := batchPolicies
	seedCorrupt(ctx, batchClient, singleClient)
	preload(t, batchClient) // no call sent twice (not found, then loaded)
	rng := rand.New(rand.NewPCG(7, 11))
	now := testkit.Start
	totalGroups := 0
	for round := range 80 {
		if rng.IntN(4) == 0 {
			now = now.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond)
		} else {
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		groups := make([][]ratelimit.BatchItem, 1+rng.IntN(30))
		for g := range groups {
			// A group at another time goes in another call, so after
			// groups that came later: on keys of its own, the order
			// does not matter.
			at, space := now, "k"
			if rng.IntN(10) == 0 {
				at, space = now.Add(time.Second), "later"
			}
			size := 1 + rng.IntN(5)
			if rng.IntN(40) == 0 {
				size = 17 + rng.IntN(4) // more than a call holds
			}
			for _, k := range rng.Perm(24)[:size] {
				p := policies[rng.IntN(len(policies))]
				r := ratelimit.Request{Limits: p, Cost: 1 + rng.Int64N(3), Now: at, Peek: rng.IntN(6) == 0}
				if len(p) == 2 && rng.IntN(2) == 0 {
					r.Costs = []int64{1 + rng.Int64N(2), 1 + rng.Int64N(5)}
				}
				key := fmt.Sprintf("%s%d", space, k%(6+size))
				if rng.IntN(60) == 0 {
					key = "corrupt"
				}
				groups[g] = append(groups[g], ratelimit.BatchItem{Key: key, Request: r})
			}
			if tokenbucket.ValidateAll(groups[g]) != nil { // a key drawn twice
				groups[g] = groups[g][:1]
			}
		}
		batched.ApplyGroups(ctx, groups)
		persistAll(ctx, t, batchClient)
		for g, group := range groups {
			want := make([]ratelimit.BatchItem, len(group))
			for i, it := range group {
				want[i] = ratelimit.BatchItem{Key: it.Key, Request: it.Request}
			}
			err := single.ApplyAll(ctx, want)
			persistAll(ctx, t, singleClient)
			corrupt := false
			for i, it := range group {
				corrupt = corrupt || it.Key == "corrupt"
				if (it.Err == nil) != (err == nil) || err != nil && errors.Is(err, tokenbucket.ErrCorruptState) != errors.Is(it.Err, tokenbucket.ErrCorruptState) {
					t.Fatalf("round %d group %d item %d (%s): in one call err %v, alone %v", round, g, i, it.Key, it.Err, err)
				}
				if err == nil && !reflect.DeepEqual(it.Decision, want[i].Decision) {
					t.Fatalf("round %d group %d item %d (%s %+v): in one call %+v, alone %+v", round, g, i, it.Key, it.Request, it.Decision, want[i].Decision)
				}
				if err != nil && !reflect.DeepEqual(it.Decision, (ratelimit.Decision{})) {
					t.Fatalf("round %d group %d item %d: a failed group's item has a decision %+v", round, g, i, it.Decision)
				}
			}
			if corrupt != errors.Is(err, tokenbucket.ErrCorruptState) {
				t.Fatalf("round %d group %d: with the malformed bucket %v, err %v", round, g, corrupt, err)
			}
		}
		totalGroups += len(groups)
	}
	hook.mu.Lock()
	defer hook.mu.Unlock()
	calls, carried, shared := len(hook.scripts), 0, 0
	for _, c := range hook.scripts {
		g := groupsOf(c.mode, c.keys)
		carried += g
		if g > 1 {
			shared++
		}
		if c.keys > 16 && g != 1 {
			t.Fatalf("a call of %d keys in mode %q: more than 16 keys in several groups", c.keys, c.mode)
		}
	}
	if carried != totalGroups {
		t.Fatalf("%d groups were carried as %d in %d calls; a group was split or lost", totalGroups, carried, calls)
	}
	if calls >= totalGroups/2 || shared == 0 {
		t.Fatalf("%d groups took %d script calls (%d of several groups); want shared calls", totalGroups, calls, shared)
	}
}

// queued starts n goroutines running do(i) on store (of one lane) while the
// server is stopped, once do(0) holds the lane, and waits until the others
// are queued; it returns a function that continues the server and waits
// for every goroutine.
func queued(t *testing.T, srv *redistest.Server, store *redisstore.Store, n int, do func(i int)) (cont func()) {
	t.Helper()
	srv.Stop()
	var wg sync.WaitGroup
	wg.Go(func() { do(0) })
	waitBusy(t, store, 1, 0)
	for i := 1; i < n; i++ {
		wg.Go(func() { do(i) })
	}
	waitBusy(t, store, 1, n-1)
	return func() {
		srv.Cont()
		wg.Wait()
	}
}

// waitBusy waits until store's lanes and queue are as given.
func waitBusy(t *testing.T, store *redisstore.Store, lanes, queue int) {
	t.Helper()
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		l, q := store.Busy()
		if l == lanes && q == queue {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("lanes %d and queue %d, want %d and %d", l, q, lanes, queue)
		}
	}
}

// TestQueuedApplyAllCallsShareScriptCalls: ApplyAll calls queued behind a
// busy lane go out as few script calls of whole groups of 3 (5 a call, at
// most 16 keys), each still all or nothing and independent: the one on a
// malformed bucket fails alone, the ones on an empty bucket are denied
// without charging their other buckets.
func TestQueuedApplyAllCallsShareScriptCalls(t *testing.T) {
	srv, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client, redisstore.WithLanes(1))
	client.Set(ctx, "corrupt", "not a bucket", 0)
	preload(t, client)
	shared := []ratelimit.Limit{ratelimit.PerHour(40)}
	own := []ratelimit.Limit{ratelimit.PerHour(5)}
	const n = 64
	items := make([][]ratelimit.BatchItem, n)
	errs := make([]error, n)
	for i := range items {
		items[i] = []ratelimit.BatchItem{
			{Key: "shared", Request: ratelimit.Request{Limits: shared, Cost: 1}},
			{Key: fmt.Sprint("own-a-", i), Request: ratelimit.Request{Limits: own, Cost: 1}},
			{Key: fmt.Sprint("own-b-", i), Request: ratelimit.Request{Limits: own, Cost: 2}},
		}
	}
	items[7][2].Key = "corrupt"
	client.ConfigResetStat(ctx)
	cont := queued(t, srv, store, n, func(i int) { errs[i] = store.ApplyAll(ctx, items[i]) })
	cont()
	// One call for the first, then 63 groups of 3 at 5 a call: 13.
	if got := scriptCalls(t, client); got != 1+13 {
		t.Fatalf("%d script calls, want 14", got)
	}
	admitted := 0
	for i := range items {
		if i == 7 {
			if !errors.Is(errs[i], tokenbucket.ErrCorruptState) {
				t.Fatalf("the group on the malformed bucket: %v, want ErrCorruptState", errs[i])
			}
			continue
		}
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		all := items[i][0].Decision.Allowed && items[i][1].Decision.Allowed && items[i][2].Decision.Allowed
		if all {
			admitted++
		}
		// Its own buckets were charged exactly when it was admitted.
		for j, cost := range []int64{1, 2} {
			d, err := store.Apply(ctx, items[i][1+j].Key, ratelimit.Request{Limits: own, Peek: true})
			if want := 5 - cost; err != nil || all && d.Remaining != want || !all && d.Remaining != 5 {
				t.Fatalf("request %d (admitted %v), bucket %d after: %+v %v", i, all, j, d, err)
			}
		}
	}
	if admitted != 40 {
		t.Fatalf("admitted %d of %d requests on a shared bucket of 40, want 40", admitted, n-1)
	}
	if n, _ := client.Exists(ctx, "own-a-7", "own-b-7").Result(); n != 0 {
		t.Fatal("the failed group wrote its other buckets")
	}
}

// TestQueuedApplyAllHonoursItsDeadline: an ApplyAll queued behind a hung
// call gives up at its own deadline and takes nothing.
func TestQueuedApplyAllHonoursItsDeadline(t *testing.T) {
	srv, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client, redisstore.WithLanes(1))
	limits := []ratelimit.Limit{ratelimit.PerMinute(10)}
	pair := func(a, b string) []ratelimit.BatchItem {
		return []ratelimit.BatchItem{{Key: a, Request: ratelimit.Request{Limits: limits, Cost: 1}}, {Key: b, Request: ratelimit.Request{Limits: limits, Cost: 1}}}
	}
	if err := store.ApplyAll(ctx, pair("warm-a", "warm-b")); err != nil {
		t.Fatal(err)
	}
	resume := behindAHungCall(t, srv, store, func(ctx context.Context) error {
		return store.ApplyAll(ctx, pair("first-a", "first-b"))
	})
	ctx2, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	items := pair("late-a", "late-b")
	err := store.ApplyAll(ctx2, items)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("queued ApplyAll on a hung server: %v, want its deadline", err)
	}
	if _, q := store.Busy(); q != 0 {
		t.Fatalf("%d calls still queued after the caller gave up", q)
	}
	for _, it := range items {
		if !reflect.DeepEqual(it.Decision, (ratelimit.Decision{})) || it.Err != nil {
			t.Fatalf("the given-up request's items were written: %+v", it)
		}
	}
	if err := resume(); err != nil {
		t.Fatalf("the call on the lane, once the server continued: %v", err)
	}
	if n, _ := client.Exists(ctx, "late-a", "late-b").Result(); n != 0 {
		t.Fatal("the request that gave up in the queue wrote its buckets")
	}
}

// TestTheScriptsGroupMode: groups of consecutive keys, each all or
// nothing, independent, in order; sizes that are not whole, positive and
// adding up to the keys are a malformed argument.
func TestTheScriptsGroupMode(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	policy := rawArgs("", 1, [3]int64{2, 1, 1_000_000_000})[3] // 2 a 1000 s
	eval := func(mode string, keys ...string) ([]any, error) {
		args := []any{testkit.Start.UnixMicro(), mode}
		for range keys {
			args = append(args, 1, policy)
		}
		res, err := client.Eval(ctx, script.Source, keys, args...).Result()
		if err != nil {
			return nil, err
		}
		rp, err := script.ParseCall(res, len(keys))
		if err != nil {
			return nil, err
		}
		entries := make([]any, len(keys))
		for j := range entries {
			entries[j] = rp.Entry(j)
		}
		return entries, nil
	}
	const malformed = "ratelimit: invalid argument: malformed argument"
	for _, mode := range []string{"1", "2,2", "4", "0,3", "-1,4", "1.5,1.5", "a", "1,x,1", "", "2,,1", ",3", "3,", "0x3", "3e0", " 3", "03"} {
		if _, err := eval(mode, "m1", "m2", "m3"); err == nil || !strings.Contains(err.Error(), malformed) {
			t.Errorf("groups %q of 3 keys: %v, want a malformed argument", mode, err)
		}
	}
	if n, _ := client.Exists(ctx, "m1", "m2", "m3").Result(); n != 0 {
		t.Fatal("a refused call wrote a bucket")
	}
	allowed := func(e any) bool { return e.([]any)[0].(int64)&1 == 1 }
	remaining := func(e any) int64 { return e.([]any)[1].(int64) }
	// "a" is emptied by the first group; the second group, on a and c, is
	// denied and takes nothing from c; the third, c alone, is allowed.
	v, err := eval("2,1,2,1", "a", "b", "a", "a", "c", "c")
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		allowed bool
		left    int64
	}{{true, 1}, {true, 1}, {true, 0}, {false, 0}, {true, 2}, {true, 1}}
	for i, w := range want {
		if allowed(v[i]) != w.allowed || remaining(v[i]) != w.left {
			t.Errorf("key %d: allowed %v, %d left; want %v, %d", i, allowed(v[i]), remaining(v[i]), w.allowed, w.left)
		}
	}
	// A group with a malformed bucket fails alone.
	client.Set(ctx, "bad", "not a bucket", 0)
	v, err = eval("1,2,1", "x", "y", "bad", "z")
	if err != nil {
		t.Fatal(err)
	}
	if !allowed(v[0]) || !allowed(v[3]) || remaining(v[0]) != 1 || remaining(v[3]) != 1 {
		t.Errorf("the groups beside the malformed one: %v", v)
	}
	if _, ok := v[2].([]any)[0].(error); !ok {
		t.Errorf("the malformed bucket's entry: %v, want its error", v[2])
	}
	if n, _ := client.Exists(ctx, "y").Result(); n != 0 {
		t.Error("the group with a malformed bucket took from its other key")
	}
}

// TestGroupsShareCallsBySlotOnCluster: on Cluster, groups of one slot share
// a script call, and groups of another slot go in another.
func TestGroupsShareCallsBySlotOnCluster(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	cc := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { cc.Close() })
	ctx := context.Background()
	store := redisstore.New(cc)
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerMinute(5)}, Cost: 2}
	group := func(keys ...string) []ratelimit.BatchItem {
		g := make([]ratelimit.BatchItem, len(keys))
		for i, k := range keys {
			g[i] = ratelimit.BatchItem{Key: k, Request: r}
		}
		return g
	}
	groups := [][]ratelimit.BatchItem{group("{x}1", "{x}2"), group("{y}1"), group("{x}3", "{x}1"), group("{y}2", "{y}3")}
	cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		preload(t, m)
		return m.ConfigResetStat(ctx).Err()
	})
	store.ApplyGroups(ctx, groups)
	for g, group := range groups {
		for i, it := range group {
			if it.Err != nil || !it.Decision.Allowed || it.Decision.Remaining != 3 && it.Key != "{x}1" {
				t.Fatalf("group %d item %d (%s): %+v %v", g, i, it.Key, it.Decision, it.Err)
			}
		}
	}
	if d := groups[2][1].Decision; d.Remaining != 1 {
		t.Fatalf("{x}1 named in two groups of one call: %+v, want the second to see the first's take", d)
	}
	calls := 0
	for _, m := range cluster.Masters() {
		mc := redistest.NewClient(m.Addr())
		calls += scriptCalls(t, mc)
		mc.Close()
	}
	if calls != 2 {
		t.Fatalf("groups of 2 slots took %d script calls, want 2", calls)
	}
}
