package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/redistest"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
	"github.com/redis/go-redis/v9"
)

func TestApplyBatch(t *testing.T) {
	srv, admin := standalone(t)
	ctx := context.Background()
	client, hook := hookedClient(t, srv)
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerMinute(2), ratelimit.WithClock(func() time.Time { return testkit.Start }))
	item := func(subject string, cost int64) ratelimit.BatchItem {
		key, r, _ := l.Request(subject, 1)
		r.Cost = cost
		return ratelimit.BatchItem{Key: key, Request: r}
	}
	admin.FunctionFlush(ctx)
	items := []ratelimit.BatchItem{item("a", 1), item("b", 2), item("a", 1), item("c", 3), item("a", 1)}
	store.ApplyBatch(ctx, items)
	want := []struct {
		allowed bool
		remain  int64
		invalid bool
	}{{true, 1, false}, {true, 0, false}, {true, 0, false}, {false, 0, true}, {false, 0, false}}
	for i, w := range want {
		it := items[i]
		if w.invalid {
			if !errors.Is(it.Err, ratelimit.ErrInvalidArgument) {
				t.Errorf("item %d: err = %v, want ErrInvalidArgument", i, it.Err)
			}
			continue
		}
		if it.Err != nil || it.Decision.Allowed != w.allowed || it.Decision.Remaining != w.remain {
			t.Errorf("item %d = %+v, %v; want allowed=%v remaining=%d", i, it.Decision, it.Err, w.allowed, w.remain)
		}
	}
	// The four valid items share one script call: one FCALL, and after
	// FUNCTION FLUSH one FUNCTION LOAD and the FCALL again; nothing else.
	var pipes []string
	for _, p := range hook.pipes {
		if !strings.HasPrefix(p, "client") && !strings.HasPrefix(p, "hello") { // a new connection's handshake
			pipes = append(pipes, p)
		}
	}
	if got := strings.Join(pipes, " | "); got != "fcall | fcall" {
		t.Errorf("pipelines sent: %q", got)
	}
	var names []string
	for _, n := range hook.names {
		if n != "client" && n != "hello" { // a new connection's handshake
			names = append(names, n)
		}
	}
	if got := strings.Join(names, " "); got != "function" {
		t.Errorf("commands sent outside pipelines: %q, want the one FUNCTION LOAD", got)
	}
}

func TestCoalescingSendsConcurrentChecksTogether(t *testing.T) {
	srv, _ := standalone(t)
	ctx := context.Background()
	client, hook := hookedClient(t, srv)
	l, _ := ratelimit.NewEncoded(redisstore.New(client), strconv.Itoa, []ratelimit.Limit{ratelimit.PerHour(300)}, ratelimit.WithClock(func() time.Time { return testkit.Start }))
	const workers, each = 32, 40
	admitted := testkit.Concurrently(t, workers, each, func(w, i int) (bool, error) {
		d, err := l.TryAcquire(ctx, (w*each+i)%3) // three hot subjects
		return d.Allowed, err
	})
	if got := admitted; got != 3*300 {
		t.Fatalf("admitted %d of %d checks on 3 subjects of 300, want exactly 900", got, workers*each)
	}
	hook.mu.Lock()
	trips := len(hook.names) + len(hook.pipes)
	hook.mu.Unlock()
	if trips >= workers*each {
		t.Fatalf("%d checks took %d round trips; concurrent checks were not coalesced", workers*each, trips)
	}
	t.Logf("%d checks from %d goroutines took %d round trips", workers*each, workers, trips)
}

// behindAHungCall stops srv and starts first on a goroutine of its own, with
// a deadline of 5 s, so that it hangs on the stopped server and holds one of
// store's lanes; it returns once first is in flight. resume continues the
// server and returns first's error.
func behindAHungCall(t *testing.T, srv *redistest.Server, store *redisstore.Store, first func(ctx context.Context) error) (resume func() error) {
	t.Helper()
	srv.Stop()
	t.Cleanup(srv.Cont)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		done <- first(ctx)
	}()
	waitBusy(t, store, 1, 0)
	return func() error {
		srv.Cont()
		return <-done
	}
}

func TestCoalescedCheckHonoursItsDeadline(t *testing.T) {
	srv, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerSecond(10))
	if _, err := l.TryAcquire(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	// The first check hangs on the stopped server; the second queues behind
	// it and must give up at its own deadline.
	resume := behindAHungCall(t, srv, store, func(ctx context.Context) error {
		_, err := l.TryAcquire(ctx, "a")
		return err
	})
	ctx2, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.TryAcquire(ctx2, "b")
	if took := time.Since(start); err == nil || testkit.Timed(t) && took > time.Second {
		t.Fatalf("queued check on a hung server: err %v after %v; want an error at its 200ms deadline", err, took)
	}
	if err := resume(); err == nil {
		t.Log("the first check completed after SIGCONT")
	}
}

func TestBatchOnClusterWithAMasterDown(t *testing.T) {
	cluster := redistest.StartCluster(t, 3, 0)
	client := redistest.NewClusterClient(cluster.Addrs()...)
	defer client.Close()
	store := redisstore.New(client)
	l, _ := ratelimit.New[string](store, ratelimit.PerMinute(5), ratelimit.WithClock(func() time.Time { return testkit.Start }))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var items []ratelimit.BatchItem
	for i := range 60 {
		key, r, _ := l.Request(fmt.Sprint("s", i), 1)
		items = append(items, ratelimit.BatchItem{Key: key, Request: r})
	}
	store.ApplyBatch(ctx, items)
	for i, it := range items {
		if it.Err != nil || !it.Decision.Allowed {
			t.Fatalf("item %d with every master up: %+v %v", i, it.Decision, it.Err)
		}
	}
	dead := cluster.Masters()[0]
	owner := make([]string, len(items))
	for i, it := range items {
		owner[i] = cluster.MasterOf(redistest.SlotOf(it.Key)).Addr()
	}
	dead.Kill()
	store.ApplyBatch(ctx, items)
	var onDead, decided int
	for i, it := range items {
		if owner[i] == dead.Addr() {
			onDead++
			if it.Err == nil {
				t.Errorf("item %d on the dead master was decided: %+v", i, it.Decision)
			}
			continue
		}
		if it.Err != nil || !it.Decision.Allowed || it.Decision.Remaining != 3 {
			t.Errorf("item %d on a live master = %+v, %v; want allowed with 3 left", i, it.Decision, it.Err)
		}
		decided++
	}
	if onDead == 0 || decided == 0 {
		t.Fatalf("%d items on the dead master, %d on live ones; want some of each", onDead, decided)
	}
}

// batchPolicies are the policies the random batch tests draw from.
var batchPolicies = [][]ratelimit.Limit{
	{ratelimit.PerSecond(10)},
	{ratelimit.PerMinute(3)},
	{ratelimit.PerSecond(7), ratelimit.PerMinute(20)},
	{{Capacity: 10, RefillTokens: 1, RefillPeriod: 100 * time.Millisecond}}, // PerSecond(10) in other terms
}

// persistAll removes the expiry of every key of each of clients. The random
// batch tests decide on an injected clock while Redis expires keys in real
// time: a key one server expired and the other not yet would make their
// decisions differ. Without its expiry a key still decides as an expired one
// once its bucket is full again on the injected clock (a full bucket is a
// missing one), so each test persists the keys right after every call; what
// is left is a key whose expiry of a millisecond or two passes before the
// call that follows it.
func persistAll(ctx context.Context, t *testing.T, clients ...redis.UniversalClient) {
	t.Helper()
	for _, c := range clients {
		keys, err := c.Keys(ctx, "*").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			c.Persist(ctx, k)
		}
	}
}

// seedCorrupt stores a value at key "corrupt" that is not a bucket, on each
// of clients.
func seedCorrupt(ctx context.Context, clients ...redis.UniversalClient) {
	for _, c := range clients {
		c.Set(ctx, "corrupt", "not a bucket", 0)
	}
}

// TestBatchedChecksAreDecidedAsSingleCalls sends the same random checks
// (repeated keys, peeks, denials, policy changes, a malformed bucket, clocks
// behind) to one server as ApplyBatch's shared script calls and to another
// as one Apply each, and wants every decision and error equal, and calls of
// at most 16 keys each.
func TestBatchedChecksAreDecidedAsSingleCalls(t *testing.T) {
	_, batchClient := standalone(t)
	_, singleClient := standalone(t)
	ctx := context.Background()
	batched, single := redisstore.New(batchClient), redisstore.New(singleClient)
	policies := batchPolicies
	seedCorrupt(ctx, batchClient, singleClient)
	rng := rand.New(rand.NewPCG(3, 5))
	now := testkit.Start
	total := 0
	for round := range 60 {
		if rng.IntN(4) == 0 {
			now = now.Add(-time.Duration(rng.IntN(2000)) * time.Millisecond)
		} else {
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		items := make([]ratelimit.BatchItem, 1+rng.IntN(40))
		for i := range items {
			p := policies[rng.IntN(len(policies))]
			r := ratelimit.Request{Limits: p, Cost: 1 + rng.Int64N(3), Now: now, Peek: rng.IntN(6) == 0}
			key := fmt.Sprintf("k%d", rng.IntN(6))
			if rng.IntN(30) == 0 {
				key = "corrupt"
			}
			items[i] = ratelimit.BatchItem{Key: key, Request: r}
		}
		batched.ApplyBatch(ctx, items)
		persistAll(ctx, t, batchClient)
		for i, it := range items {
			d, err := single.Apply(ctx, it.Key, it.Request)
			persistAll(ctx, t, singleClient)
			if !reflect.DeepEqual(d, it.Decision) || (err == nil) != (it.Err == nil) || err != nil && errors.Is(err, tokenbucket.ErrCorruptState) != errors.Is(it.Err, tokenbucket.ErrCorruptState) {
				t.Fatalf("round %d item %d (%s %+v): batched %+v %v, single %+v %v", round, i, it.Key, it.Request, it.Decision, it.Err, d, err)
			}
			if it.Key == "corrupt" && !errors.Is(it.Err, tokenbucket.ErrCorruptState) {
				t.Fatalf("round %d item %d on the malformed bucket: %+v %v", round, i, it.Decision, it.Err)
			}
		}
		total += len(items)
	}
	calls := scriptCalls(t, batchClient)
	if calls >= total/4 {
		t.Fatalf("%d checks took %d script calls; want calls of several keys", total, calls)
	}
	if least := (total + 15) / 16; calls < least {
		t.Fatalf("%d checks took %d script calls, fewer than at 16 keys a call (%d)", total, calls, least)
	}
}

// TestABatchSharesScriptCallsByTimeAndSlot: checks decided at different
// times do not share a call, and on Cluster checks of one slot share a call
// while the others are sent one per key.
func TestABatchSharesScriptCallsByTimeAndSlot(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client)
	r := func(now time.Time) ratelimit.Request {
		return ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 1, Now: now}
	}
	t0, t1 := testkit.Start, testkit.Start.Add(time.Second)
	items := []ratelimit.BatchItem{{Key: "a", Request: r(t0)}, {Key: "b", Request: r(t1)}, {Key: "c", Request: r(t0)}, {Key: "d", Request: r(time.Time{})}}
	preload(t, client)
	client.ConfigResetStat(ctx)
	store.ApplyBatch(ctx, items)
	for _, it := range items {
		if it.Err != nil || !it.Decision.Allowed {
			t.Fatalf("%s: %+v %v", it.Key, it.Decision, it.Err)
		}
	}
	if n := scriptCalls(t, client); n != 3 {
		t.Fatalf("checks at 3 times took %d script calls, want 3", n)
	}

	cluster := redistest.StartCluster(t, 3, 0)
	cc := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { cc.Close() })
	store = redisstore.New(cc)
	items = items[:0]
	for i := range 8 {
		items = append(items, ratelimit.BatchItem{Key: fmt.Sprintf("{tag}%d", i), Request: r(time.Time{})})
	}
	for i := range 6 {
		items = append(items, ratelimit.BatchItem{Key: fmt.Sprintf("spread-%d", i), Request: r(time.Time{})})
	}
	slots := map[uint16]bool{}
	for _, it := range items {
		slots[uint16(redistest.SlotOf(it.Key))] = true
	}
	cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		preload(t, m)
		return m.ConfigResetStat(ctx).Err()
	})
	store.ApplyBatch(ctx, items)
	for _, it := range items {
		if it.Err != nil || !it.Decision.Allowed {
			t.Fatalf("%s: %+v %v", it.Key, it.Decision, it.Err)
		}
	}
	calls := 0
	for _, m := range cluster.Masters() {
		mc := redistest.NewClient(m.Addr())
		calls += scriptCalls(t, mc)
		mc.Close()
	}
	if calls != len(slots) {
		t.Fatalf("checks of %d slots took %d script calls, want one per slot", len(slots), calls)
	}
}

// TestABatchLoadsTheLibraryOncePerServer: a pipeline whose calls find no
// library loads it once on each server it spans, not once per call, and
// every call is decided.
func TestABatchLoadsTheLibraryOncePerServer(t *testing.T) {
	ctx := context.Background()
	r := func(now time.Time) ratelimit.Request {
		return ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 1, Now: now}
	}
	decided := func(t *testing.T, items []ratelimit.BatchItem) {
		t.Helper()
		for _, it := range items {
			if it.Err != nil || !it.Decision.Allowed {
				t.Fatalf("%s: %+v %v", it.Key, it.Decision, it.Err)
			}
		}
	}

	_, client := standalone(t)
	store := redisstore.New(client)
	var items []ratelimit.BatchItem
	for i := range 5 { // five times: five script calls in one pipeline
		items = append(items, ratelimit.BatchItem{Key: fmt.Sprint("k", i), Request: r(testkit.Start.Add(time.Duration(i) * time.Second))})
	}
	client.FunctionFlush(ctx)
	client.ConfigResetStat(ctx)
	store.ApplyBatch(ctx, items)
	decided(t, items)
	if n, calls := commandCalls(t, client, "function|load"), scriptCalls(t, client); n != 1 || calls != 10 {
		t.Errorf("%d FUNCTION LOAD and %d script calls, want 1 and 10 (5 not found, 5 run)", n, calls)
	}

	cluster := redistest.StartCluster(t, 3, 0)
	cc := redistest.NewClusterClient(cluster.Addrs()...)
	t.Cleanup(func() { cc.Close() })
	store = redisstore.New(cc)
	items = items[:0]
	for i := range 30 {
		items = append(items, ratelimit.BatchItem{Key: fmt.Sprint("spread-", i), Request: r(time.Time{})})
	}
	cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		m.FunctionFlush(ctx)
		return m.ConfigResetStat(ctx).Err()
	})
	store.ApplyBatch(ctx, items)
	decided(t, items)
	for _, m := range cluster.Masters() {
		mc := redistest.NewClient(m.Addr())
		if n := commandCalls(t, mc, "function|load"); n != 1 {
			t.Errorf("master %s: %d FUNCTION LOAD, want 1", m.Addr(), n)
		}
		mc.Close()
	}
}

// TestAUsualCallWithAMalformedBucket: a script call of usual checks (a cost
// of 1, one limit), one of whose buckets is malformed, answers that key with
// the error and decides the others, for calls of several sizes in turn: the
// script keeps the table of such a reply from call to call, longer than a
// call of fewer keys needs, and ends the reply after the call's keys.
func TestAUsualCallWithAMalformedBucket(t *testing.T) {
	_, client := standalone(t)
	ctx := context.Background()
	store := redisstore.New(client)
	seedCorrupt(ctx, client)
	limits := []ratelimit.Limit{ratelimit.PerSecond(10)}
	quotas := []ratelimit.Quota{ratelimit.CalendarQuota(100, ratelimit.Day, nil)}
	for call, n := range []int{16, 2, 3, 9, 5, 16, 4, 4, 16, 3} {
		items := make([]ratelimit.BatchItem, n)
		for i := range items {
			r := ratelimit.Request{Limits: limits, Cost: 1}
			if call >= 6 {
				r.Quotas = quotas // (a limit and a quota: W 9)
			}
			items[i] = ratelimit.BatchItem{Key: fmt.Sprintf("u%d-%d", call/6, i), Request: r}
		}
		items[n/2].Key = "corrupt"
		if call == 7 {
			items[n/2].Key = "u1-0" // (no error: the call after takes the kept table back)
		}
		store.ApplyBatch(ctx, items)
		for i, it := range items {
			if i == n/2 && call != 7 {
				if !errors.Is(it.Err, tokenbucket.ErrCorruptState) {
					t.Errorf("%d keys: the malformed bucket: %+v %v, want ErrCorruptState", n, it.Decision, it.Err)
				}
			} else if it.Err != nil || !it.Decision.Allowed {
				t.Errorf("%d keys: key %d: %+v %v, want allowed", n, i, it.Decision, it.Err)
			}
		}
	}
}
