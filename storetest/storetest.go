package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/testkit"
)

// Run runs the behaviour suite, one subtest per case, each over a store
// from newStore: the cases of every Store, then those of a
// ratelimit.Reserver, of a ratelimit.BatchStore and of a
// ratelimit.Assigner, which are skipped when the store lacks the
// capability. Run calls newStore once per case,
// from the case's subtest, which newStore may use for t.Cleanup or
// t.Fatal. newStore may return a new store each time or the same one (a
// store over a server started once, say): each case checks keys of a
// namespace of its own, so the store may also be shared with other tests.
func Run(t *testing.T, newStore func(t *testing.T) ratelimit.Store) {
	runCases(t, newStore, cases, "", nil)
	runCases(t, newStore, quotaCases, "", nil)
	for _, cs := range [][]envCase{reserveCases, reserveQuotaCases} {
		runCases(t, newStore, cs, "ratelimit.Reserver", func(s ratelimit.Store) bool {
			_, ok := s.(ratelimit.Reserver)
			return ok
		})
	}
	for _, tc := range append(batchCases, quotaBatchCases...) {
		t.Run(tc.name, func(t *testing.T) {
			store := newStore(t)
			bs, ok := store.(ratelimit.BatchStore)
			if !ok {
				t.Skipf("%T is not a ratelimit.BatchStore", store)
			}
			ns := fmt.Sprintf("suite-%s-%d", t.Name(), time.Now().UnixNano())
			tc.run(t, &batchEnv{ctx: context.Background(), store: bs, now: testkit.Start, ns: ns})
		})
	}
	runAssignCases(t, newStore)
}

// runCases runs each case with a store, a clock and a namespace of its
// own. When has is not nil, a case whose store it is false for, a store
// that is not a need, is skipped.
func runCases(t *testing.T, newStore func(*testing.T) ratelimit.Store, cases []envCase, need string, has func(ratelimit.Store) bool) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := newStore(t)
			if has != nil && !has(store) {
				t.Skipf("%T is not a %s", store, need)
			}
			clock := testkit.NewClock(testkit.Start)
			ns := fmt.Sprintf("suite-%s-%d", t.Name(), time.Now().UnixNano())
			newWith := func(limits []ratelimit.Limit, opts ...ratelimit.Option) *ratelimit.Limiter[string] {
				t.Helper()
				l, err := ratelimit.NewMulti[string](store, limits, append([]ratelimit.Option{ratelimit.WithNamespace(ns), ratelimit.WithClock(clock.Now)}, opts...)...)
				if err != nil {
					t.Fatal(err)
				}
				return l
			}
			newLimiter := func(limits ...ratelimit.Limit) *ratelimit.Limiter[string] {
				t.Helper()
				return newWith(limits)
			}
			tc.run(t, &env{ctx: context.Background(), clock: clock, newLimiter: newLimiter, newWith: newWith})
		})
	}
}

// envCase is a case of the suite that works through Limiters.
type envCase struct {
	name string
	run  func(t *testing.T, e *env)
}

type env struct {
	ctx        context.Context
	clock      *testkit.Clock
	newLimiter func(...ratelimit.Limit) *ratelimit.Limiter[string]
	// newWith is newLimiter with options of the case's own (quotas, say).
	newWith func([]ratelimit.Limit, ...ratelimit.Option) *ratelimit.Limiter[string]
}

// want checks one decision.
func want(t *testing.T, what string, d ratelimit.Decision, err error, allowed bool, remaining int64, retry, reset time.Duration) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if d.Allowed != allowed || d.Remaining != remaining || d.RetryAfter != retry || d.ResetAfter != reset {
		t.Fatalf("%s = {allowed:%v remaining:%d retry:%v reset:%v}, want {allowed:%v remaining:%d retry:%v reset:%v}",
			what, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, allowed, remaining, retry, reset)
	}
}

var cases = []envCase{
	{"a full bucket admits its capacity then denies with the wait", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(4))
		for i := range 4 {
			d, err := l.TryAcquire(e.ctx, "s")
			want(t, fmt.Sprintf("check %d", i), d, err, true, int64(3-i), 0, time.Duration(i+1)*15*time.Second)
		}
		d, err := l.TryAcquire(e.ctx, "s")
		want(t, "fifth check", d, err, false, 0, 15*time.Second, time.Minute)
		e.clock.Add(15*time.Second - time.Microsecond)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "1µs short of a token", d, err, false, 0, time.Microsecond, 45*time.Second+time.Microsecond)
		e.clock.Add(time.Microsecond)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "on time", d, err, true, 0, 0, time.Minute)
	}},
	{"refill is smooth and carries the sub-token remainder", func(t *testing.T, e *env) {
		// 3 tokens per 10 s. (Minutes and seconds rather than µs: the
		// keys expire on the server's real clock and must outlive the test.)
		l := e.newLimiter(ratelimit.Limit{Capacity: 3, RefillTokens: 3, RefillPeriod: 10 * time.Second})
		d, err := l.TryAcquireN(e.ctx, "s", 3)
		want(t, "drain", d, err, true, 0, 0, 10*time.Second)
		e.clock.Add(4 * time.Second) // 1.2 tokens
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "+4s", d, err, true, 0, 0, 9333334*time.Microsecond) // 2.8 tokens short
		e.clock.Add(3 * time.Second)                                 // 0.2 + 0.9 = 1.1 tokens: the remainder counts
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "+7s", d, err, true, 0, 0, 9666667*time.Microsecond)
		e.clock.Add(2 * time.Second) // 0.1 + 0.6
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "+9s", d, err, false, 0, time.Second, 7666667*time.Microsecond)
	}},
	{"a denial consumes nothing and reports the untouched balance", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(10))
		d, err := l.TryAcquireN(e.ctx, "s", 7)
		want(t, "cost 7", d, err, true, 3, 0, 42*time.Second)
		for i := range 3 {
			d, err = l.TryAcquireN(e.ctx, "s", 5)
			want(t, fmt.Sprintf("cost 5, try %d", i), d, err, false, 3, 12*time.Second, 42*time.Second)
		}
		d, err = l.TryAcquireN(e.ctx, "s", 3)
		want(t, "cost 3", d, err, true, 0, 0, time.Minute)
	}},
	{"peek refills but takes nothing", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(2))
		d, err := l.Peek(e.ctx, "s")
		want(t, "peek at a new subject", d, err, true, 2, 0, 0)
		l.TryAcquireN(e.ctx, "s", 2)
		d, err = l.Peek(e.ctx, "s")
		want(t, "peek at an empty bucket", d, err, false, 0, 30*time.Second, time.Minute)
		e.clock.Add(36 * time.Second)
		for i := range 3 {
			d, err = l.Peek(e.ctx, "s")
			want(t, fmt.Sprintf("peek %d after 36 s", i), d, err, true, 1, 0, 24*time.Second)
		}
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "take after peeking", d, err, true, 0, 0, 54*time.Second)
	}},
	{"reset deletes the bucket so the next check starts full", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerHour(5))
		l.TryAcquireN(e.ctx, "s", 5)
		if err := l.Reset(e.ctx, "s"); err != nil {
			t.Fatal(err)
		}
		d, err := l.TryAcquire(e.ctx, "s")
		want(t, "after reset", d, err, true, 4, 0, 12*time.Minute)
		if err := l.Reset(e.ctx, "never-seen"); err != nil {
			t.Fatalf("reset of a missing bucket: %v", err)
		}
	}},
	{"subjects and namespaces are independent", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(1))
		other := e.newLimiter(ratelimit.PerMinute(1))
		d, err := l.TryAcquire(e.ctx, "a")
		want(t, "a", d, err, true, 0, 0, time.Minute)
		d, err = l.TryAcquire(e.ctx, "b")
		want(t, "b", d, err, true, 0, 0, time.Minute)
		d, err = other.TryAcquire(e.ctx, "a")
		want(t, "a again in the same namespace", d, err, false, 0, time.Minute, time.Minute)
	}},
	{"a policy change credits the time at the old rate, then carries over up to the new capacity", func(t *testing.T, e *env) {
		old := e.newLimiter(ratelimit.PerMinute(10))
		bigger := e.newLimiter(ratelimit.PerMinute(100))
		smaller := e.newLimiter(ratelimit.PerMinute(4))
		d, err := old.TryAcquireN(e.ctx, "s", 3)
		want(t, "old policy", d, err, true, 7, 0, 18*time.Second)
		// 3 s at the old rate refill half a token: 7.5 are carried over.
		e.clock.Add(3 * time.Second)
		d, err = bigger.TryAcquire(e.ctx, "s")
		want(t, "new policy", d, err, true, 6, 0, 56100*time.Millisecond)
		// 600 ms at the new rate refill one: 7.5 again.
		e.clock.Add(600 * time.Millisecond)
		d, err = old.TryAcquire(e.ctx, "s")
		want(t, "old policy again", d, err, true, 6, 0, 21*time.Second)
		if !d.Converted {
			t.Fatalf("a check that converted the bucket: %+v, want Converted", d)
		}
		d, err = smaller.TryAcquire(e.ctx, "s")
		want(t, "smaller policy", d, err, true, 3, 0, 15*time.Second)
	}},
	{"alternating policies during a deploy never mint tokens", func(t *testing.T, e *env) {
		a := e.newLimiter(ratelimit.PerMinute(10))
		b := e.newLimiter(ratelimit.NewLimit(10, time.Minute, 20))
		admitted := 0
		for i := range 60 {
			l := a
			if i%2 == 1 {
				l = b
			}
			d, err := l.TryAcquire(e.ctx, "s")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
			e.clock.Add(100 * time.Millisecond) // 6 s in all: one token of refill
		}
		if admitted > 11 {
			t.Fatalf("admitted %d in 6 s of alternating policies, want at most 10 + 1 refilled", admitted)
		}
	}},
	{"a backward clock credits nothing and folds the wait into RetryAfter", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerMinute(10))
		d, err := l.TryAcquireN(e.ctx, "s", 10)
		want(t, "drain", d, err, true, 0, 0, time.Minute)
		e.clock.Add(-30 * time.Second)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "30 s in the past", d, err, false, 0, 36*time.Second, 90*time.Second)
		e.clock.Add(36 * time.Second)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "6 s after the bucket's time", d, err, true, 0, 0, time.Minute)
	}},
	{"several limits are decided as one", func(t *testing.T, e *env) {
		perMin := ratelimit.PerMinute(3)
		perDay := ratelimit.NewLimit(5, 24*time.Hour, 5)
		l := e.newLimiter(perMin, perDay)
		for i := range 3 {
			d, err := l.TryAcquire(e.ctx, "s")
			want(t, fmt.Sprintf("check %d", i), d, err, true, int64(2-i), 0, time.Duration(i+1)*24*time.Hour/5)
			if d.Limit != perMin {
				t.Fatalf("check %d bound by %v, want %v", i, d.Limit, perMin)
			}
		}
		d, err := l.TryAcquire(e.ctx, "s")
		want(t, "fourth", d, err, false, 0, 20*time.Second, 3*24*time.Hour/5)
		e.clock.Add(time.Minute)
		for i := range 2 {
			d, err = l.TryAcquire(e.ctx, "s")
			if err != nil || !d.Allowed || d.Limit != perDay {
				t.Fatalf("after a minute, check %d = %+v %v; want allowed, bound by the day limit", i, d, err)
			}
		}
		d, err = l.TryAcquire(e.ctx, "s")
		if err != nil || d.Allowed || d.Limit != perDay || d.Remaining != 0 {
			t.Fatalf("sixth check of the day = %+v %v; want denied by the day limit", d, err)
		}
	}},
	{"changing one of several limits carries over that limit's own tokens", func(t *testing.T, e *env) {
		day := 24 * time.Hour
		before := e.newLimiter(ratelimit.PerMinute(10), ratelimit.NewLimit(20, day, 20))
		after := e.newLimiter(ratelimit.PerMinute(10), ratelimit.NewLimit(30, day, 30))
		d, err := before.TryAcquireN(e.ctx, "s", 10)
		want(t, "drain the minute", d, err, true, 0, 0, 12*time.Hour)
		e.clock.Add(time.Minute)
		// The minute limit is unchanged and refilled; the day limit changed
		// and keeps its own 10 tokens and the 1/72 of a token refilled in
		// the minute (not the minute's 0 of before), less the 2 units of
		// 1/(2.88·10^9) of a token that carry takes off.
		d, err = after.TryAcquire(e.ctx, "s")
		want(t, "after the day limit changed", d, err, true, 9, 0, 60440*time.Second+2*time.Microsecond)
	}},
	{"the largest exact values stay exact", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.Limit{Capacity: 1 << 32, RefillTokens: 1, RefillPeriod: 1 << 20 * time.Microsecond})
		d, err := l.TryAcquireN(e.ctx, "s", 1<<32)
		want(t, "drain 2^32", d, err, true, 0, 0, (1<<52)*time.Microsecond)
		e.clock.Add((1<<20 - 1) * time.Microsecond)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "1µs early", d, err, false, 0, time.Microsecond, (1<<52-1<<20+1)*time.Microsecond)
		e.clock.Add(time.Microsecond)
		d, err = l.TryAcquire(e.ctx, "s")
		want(t, "on time", d, err, true, 0, 0, (1<<52)*time.Microsecond)
	}},
	{"concurrent checks at one instant admit exactly the capacity", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerHour(50))
		admitted := testkit.Concurrently(t, 8, 25, func(int, int) (bool, error) {
			d, err := l.TryAcquire(e.ctx, "hot")
			return d.Allowed, err
		})
		if admitted != 50 {
			t.Fatalf("200 concurrent checks: %d admitted, want exactly 50", admitted)
		}
	}},
	{"invalid requests are refused by the store itself", func(t *testing.T, e *env) {
		l := e.newLimiter(ratelimit.PerSecond(1))
		store := l.Store()
		for _, r := range []ratelimit.Request{
			{Limits: []ratelimit.Limit{{}}, Cost: 1},
			{Limits: []ratelimit.Limit{ratelimit.PerSecond(1)}, Cost: 2},
			{Limits: []ratelimit.Limit{ratelimit.PerSecond(1)}, Cost: 0},
			{Limits: nil, Cost: 1},
		} {
			if _, err := store.Apply(e.ctx, l.Key("s"), r); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("Apply(%+v) err = %v, want ErrInvalidArgument", r, err)
			}
		}
	}},
}

// batchEnv is what a BatchStore case works with: the store, a time and a
// namespace of its own.
type batchEnv struct {
	ctx   context.Context
	store ratelimit.BatchStore
	now   time.Time
	ns    string
}

// item is a check of cost on subject under limits, at e.now.
func (e *batchEnv) item(subject string, cost int64, limits ...ratelimit.Limit) ratelimit.BatchItem {
	return ratelimit.BatchItem{Key: keyfmt.Key(e.ns, subject), Request: ratelimit.Request{Limits: limits, Cost: cost, Now: e.now}}
}

// left returns the tokens subject holds under limit at e.now.
func (e *batchEnv) left(t *testing.T, subject string, limit ratelimit.Limit) int64 {
	t.Helper()
	d, err := e.store.Apply(e.ctx, keyfmt.Key(e.ns, subject), ratelimit.Request{Limits: []ratelimit.Limit{limit}, Peek: true, Now: e.now})
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

var batchCases = []struct {
	name string
	run  func(t *testing.T, e *batchEnv)
}{
	{"ApplyBatch decides each item on its own, items on one key in order", func(t *testing.T, e *batchEnv) {
		lim := ratelimit.PerMinute(3)
		items := []ratelimit.BatchItem{
			e.item("a", 2, lim), e.item("b", 1, lim), e.item("a", 2, lim), e.item("a", 1, lim),
			e.item("c", 0, lim), // invalid: cost 0
		}
		e.store.ApplyBatch(e.ctx, items)
		for i, w := range []struct {
			allowed bool
			left    int64
		}{{true, 1}, {true, 2}, {false, 1}, {true, 0}} {
			it := items[i]
			if it.Err != nil || it.Decision.Allowed != w.allowed || it.Decision.Remaining != w.left {
				t.Fatalf("item %d = %+v, %v; want allowed %v, remaining %d", i, it.Decision, it.Err, w.allowed, w.left)
			}
		}
		if !errors.Is(items[4].Err, ratelimit.ErrInvalidArgument) {
			t.Fatalf("invalid item: err = %v, want ErrInvalidArgument", items[4].Err)
		}
		if got := e.left(t, "c", lim); got != 3 {
			t.Fatalf("the invalid item took from its bucket: %d left", got)
		}
	}},
	{"ApplyAll takes every cost when every bucket holds it", func(t *testing.T, e *batchEnv) {
		perClient, perRoute := ratelimit.PerMinute(5), ratelimit.PerMinute(10)
		items := []ratelimit.BatchItem{e.item("client", 2, perClient), e.item("route", 4, perRoute), e.item("peeked", 1, perClient)}
		items[2].Request.Peek = true
		if err := e.store.ApplyAll(e.ctx, items); err != nil {
			t.Fatal(err)
		}
		for i, left := range []int64{3, 6, 5} {
			if d := items[i].Decision; !d.Allowed || d.Remaining != left {
				t.Fatalf("item %d = %+v, want allowed with %d left", i, d, left)
			}
		}
		if e.left(t, "client", perClient) != 3 || e.left(t, "route", perRoute) != 6 || e.left(t, "peeked", perClient) != 5 {
			t.Fatal("the buckets do not hold what the decisions said")
		}
	}},
	{"ApplyAll takes nothing when one bucket denies", func(t *testing.T, e *batchEnv) {
		lim := ratelimit.PerMinute(5)
		if err := e.store.ApplyAll(e.ctx, []ratelimit.BatchItem{e.item("full", 4, lim)}); err != nil {
			t.Fatal(err)
		}
		items := []ratelimit.BatchItem{e.item("fresh", 3, lim), e.item("full", 3, lim)}
		if err := e.store.ApplyAll(e.ctx, items); err != nil {
			t.Fatal(err)
		}
		if d := items[0].Decision; !d.Allowed || d.Remaining != 5 {
			t.Fatalf("the bucket that held its cost = %+v, want allowed with its untouched 5", d)
		}
		if d := items[1].Decision; d.Allowed || d.Remaining != 1 || d.RetryAfter != 24*time.Second {
			t.Fatalf("the bucket that denied = %+v, want denied, 1 left, retry in 24s", d)
		}
		if e.left(t, "fresh", lim) != 5 || e.left(t, "full", lim) != 1 {
			t.Fatal("a denied ApplyAll took tokens")
		}
	}},
	{"ApplyAll takes a cost per limit, and nothing when denied", func(t *testing.T, e *batchEnv) {
		rpm, tpm := ratelimit.PerMinute(3), ratelimit.PerMinute(1000)
		multi := func(subject string, costs ...int64) ratelimit.BatchItem {
			it := e.item(subject, 0, rpm, tpm)
			it.Request.Costs = costs
			return it
		}
		items := []ratelimit.BatchItem{multi("tenant", 1, 600), e.item("route", 1, rpm)}
		if err := e.store.ApplyAll(e.ctx, items); err != nil {
			t.Fatal(err)
		}
		if d := items[0].Decision; !d.Allowed || d.Remaining != 2 {
			t.Fatalf("tenant = %+v, want allowed with 2 requests left", d)
		}
		items = []ratelimit.BatchItem{multi("tenant", 1, 600), e.item("route", 1, rpm)}
		if err := e.store.ApplyAll(e.ctx, items); err != nil {
			t.Fatal(err)
		}
		if d := items[0].Decision; d.Allowed || d.Limit != tpm {
			t.Fatalf("tenant's second = %+v, want denied by its tokens", d)
		}
		d, err := e.store.Apply(e.ctx, keyfmt.Key(e.ns, "tenant"), ratelimit.Request{Limits: []ratelimit.Limit{rpm, tpm}, Costs: []int64{2, 400}, Now: e.now})
		if err != nil || !d.Allowed {
			t.Fatalf("what is left, 2 requests and 400 tokens: %+v %v; want allowed (the denial took nothing)", d, err)
		}
		if e.left(t, "route", rpm) != 2 {
			t.Fatal("route's bucket does not hold what the decisions said")
		}
	}},
	{"ApplyAll refuses a key named twice, and an invalid item, before taking anything", func(t *testing.T, e *batchEnv) {
		lim := ratelimit.PerMinute(5)
		for name, items := range map[string][]ratelimit.BatchItem{
			"a key twice":  {e.item("x", 1, lim), e.item("x", 1, lim)},
			"cost 0":       {e.item("x", 1, lim), e.item("y", 0, lim)},
			"another time": {e.item("x", 1, lim), {Key: keyfmt.Key(e.ns, "y"), Request: ratelimit.Request{Limits: []ratelimit.Limit{lim}, Cost: 1, Now: e.now.Add(time.Second)}}},
		} {
			if err := e.store.ApplyAll(e.ctx, items); !errors.Is(err, ratelimit.ErrInvalidArgument) {
				t.Errorf("%s: err = %v, want ErrInvalidArgument", name, err)
			}
		}
		if e.left(t, "x", lim) != 5 {
			t.Fatal("a refused ApplyAll took tokens")
		}
	}},
}
