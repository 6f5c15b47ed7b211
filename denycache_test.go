package ratelimit_test

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
)

// cached returns a limiter with a denial cache of size on a counted
// memstore, on clock.
func cached(t testing.TB, clock *testkit.Clock, size int, limits ...ratelimit.Limit) (*ratelimit.Limiter[string], *countingStore) {
	t.Helper()
	store := &countingStore{Store: memstore.New(memstore.WithClock(clock.Now))}
	l, err := ratelimit.NewMulti[string](store, limits, ratelimit.WithClock(clock.Now), ratelimit.WithDenyCache(size))
	if err != nil {
		t.Fatal(err)
	}
	return l, store
}

// cacheStep is one check of a denial-cache table: after moving the clock by
// advance, take cost for subject and expect the outcome, its source and
// RetryAfter.
type cacheStep struct {
	advance time.Duration
	subject string
	cost    int64
	allowed bool
	source  ratelimit.Source
	retry   time.Duration
}

func runCache(t *testing.T, l *ratelimit.Limiter[string], clock *testkit.Clock, store *countingStore, steps []cacheStep) {
	t.Helper()
	ctx := context.Background()
	for i, s := range steps {
		clock.Add(s.advance)
		before := store.Applies.Load()
		d, err := l.TryAcquireN(ctx, s.subject, s.cost)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if d.Allowed != s.allowed || d.Source != s.source || d.RetryAfter != s.retry {
			t.Fatalf("step %d (+%v, %s costs %d) = {allowed:%v source:%v retry:%v}, want {allowed:%v source:%v retry:%v}",
				i, s.advance, s.subject, s.cost, d.Allowed, d.Source, d.RetryAfter, s.allowed, s.source, s.retry)
		}
		called := store.Applies.Load() - before
		if want := int64(1); s.source == ratelimit.SourceCache {
			if called != 0 {
				t.Fatalf("step %d was decided by the cache but reached the store", i)
			}
		} else if called != want {
			t.Fatalf("step %d reached the store %d times, want %d", i, called, want)
		}
	}
}

func TestDenyCache(t *testing.T) {
	store, cache := ratelimit.SourceStore, ratelimit.SourceCache
	tests := []struct {
		name   string
		limits []ratelimit.Limit
		steps  []cacheStep
	}{
		{"a denied subject is denied locally until its wait has passed, and no longer", []ratelimit.Limit{ratelimit.PerMinute(2)}, []cacheStep{
			{0, "s", 2, true, store, 0},
			{0, "s", 1, false, store, 30 * time.Second},
			{0, "s", 1, false, cache, 30 * time.Second},
			{10 * time.Second, "s", 1, false, cache, 20 * time.Second},
			{20*time.Second - time.Microsecond, "s", 1, false, cache, time.Microsecond},
			{time.Microsecond, "s", 1, true, store, 0},
		}},
		{"other subjects are not affected", []ratelimit.Limit{ratelimit.PerMinute(1)}, []cacheStep{
			{0, "s", 1, true, store, 0},
			{0, "s", 1, false, store, time.Minute},
			{0, "t", 1, true, store, 0},
			{0, "s", 1, false, cache, time.Minute},
		}},
		{"a larger cost is denied until the same time, though the store would say longer", []ratelimit.Limit{ratelimit.PerMinute(10)}, []cacheStep{
			{0, "s", 10, true, store, 0},
			{0, "s", 2, false, store, 12 * time.Second},
			{0, "s", 5, false, cache, 12 * time.Second},
			{12 * time.Second, "s", 5, false, store, 18 * time.Second},
		}},
		{"a smaller cost is denied only while the binding limit cannot have refilled it", []ratelimit.Limit{ratelimit.PerMinute(10)}, []cacheStep{
			{0, "s", 10, true, store, 0},
			{0, "s", 5, false, store, 30 * time.Second},
			// One token comes in 6 s: the cache denies cost 1 that long.
			{0, "s", 1, false, cache, 6 * time.Second},
			{0, "s", 3, false, cache, 18 * time.Second},
			{6 * time.Second, "s", 1, true, store, 0},
			// The entry still covers cost 5 (the store's answer would
			// now be longer, since a token was taken).
			{0, "s", 5, false, cache, 24 * time.Second},
		}},
		{"a cost the bucket held when it denied is never denied by the cache", []ratelimit.Limit{ratelimit.PerMinute(10)}, []cacheStep{
			{0, "s", 7, true, store, 0},
			{0, "s", 5, false, store, 12 * time.Second},
			{0, "s", 3, true, store, 0},
			{0, "s", 1, false, store, 6 * time.Second},
		}},
		{"a sub-token remainder never makes the cache deny a cost the store admits", []ratelimit.Limit{{Capacity: 3, RefillTokens: 3, RefillPeriod: 10 * time.Second}}, []cacheStep{
			{0, "s", 3, true, store, 0},
			{4 * time.Second, "s", 1, true, store, 0}, // 1.2 tokens, 0.2 left
			{0, "s", 3, false, store, 9333334 * time.Microsecond},
			// 1 token needs 0.8 more: 2666667 µs. The cache's bound,
			// 9333334 - ⌈2·10e6/3⌉ = 2666667 µs, is exactly that.
			{0, "s", 1, false, cache, 2666667 * time.Microsecond},
			{2666667 * time.Microsecond, "s", 1, true, store, 0},
		}},
		{"several limits: the binding one times the entry", []ratelimit.Limit{ratelimit.PerMinute(3), ratelimit.NewLimit(5, 24*time.Hour, 5)}, []cacheStep{
			{0, "s", 3, true, store, 0},
			{time.Minute, "s", 2, true, store, 0},
			// The day limit is empty but for 2 minutes of refill: a
			// token in 4.8 h less those.
			{time.Minute, "s", 1, false, store, 24*time.Hour/5 - 2*time.Minute},
			{time.Hour, "s", 1, false, cache, 24*time.Hour/5 - 2*time.Minute - time.Hour},
			{0, "s", 3, false, cache, 24*time.Hour/5 - 2*time.Minute - time.Hour},
		}},
		{"a clock set back is denied for the wait the store would give", []ratelimit.Limit{ratelimit.PerMinute(1)}, []cacheStep{
			{0, "s", 1, true, store, 0},
			{0, "s", 1, false, store, time.Minute},
			{-10 * time.Second, "s", 1, false, cache, 70 * time.Second},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := testkit.NewClock(testkit.Start)
			l, counted := cached(t, clock, 16, tt.limits...)
			runCache(t, l, clock, counted, tt.steps)
		})
	}
}

// TestDenyCacheOnlyDeniesWhatTheStoreWould runs random checks through a
// limiter with a cache and its twin without one, on separate stores at the
// same times. A denial consumes nothing, so both stores hold the same
// buckets throughout: every decision of the store must be the twin's, and
// every denial of the cache must be a denial of the twin, never with a
// longer wait. (The clock only moves forward here: a denial moves its
// bucket's time forward, so under a clock that moves back the twins' stores
// would part; the table above covers the cache under a clock set back.)
func TestDenyCacheOnlyDeniesWhatTheStoreWould(t *testing.T) {
	policies := [][]ratelimit.Limit{
		{ratelimit.PerMinute(10)},
		{ratelimit.NewLimit(7, 3*time.Second, 4)},
		{ratelimit.Limit{Capacity: 5, RefillTokens: 3, RefillPeriod: 10 * time.Microsecond}},
		{ratelimit.PerMinute(5), ratelimit.NewLimit(20, time.Hour, 20)},
		{ratelimit.PerSecond(7), ratelimit.NewLimit(3, 700*time.Millisecond, 9)},
	}
	rng := rand.New(rand.NewPCG(3, 5))
	ctx := context.Background()
	var hits, checks int
	for seq := range 60 {
		policy := policies[seq%len(policies)]
		clock := testkit.NewClock(testkit.Start)
		l, _ := cached(t, clock, 4, policy...)
		twin, err := ratelimit.NewMulti[string](memstore.New(memstore.WithClock(clock.Now)), policy, ratelimit.WithClock(clock.Now))
		if err != nil {
			t.Fatal(err)
		}
		minCap := policy[0].Capacity
		for _, p := range policy {
			minCap = min(minCap, p.Capacity)
		}
		period := policy[0].RefillPeriod
		for step := range 300 {
			switch x := rng.IntN(100); {
			case x < 50:
			case x < 97:
				clock.Add(time.Duration(rng.Int64N(int64(period / 4))))
			default:
				clock.Add(period)
			}
			subject := fmt.Sprint("s", rng.IntN(6)) // more subjects than the cache holds
			what := fmt.Sprintf("seq %d step %d", seq, step)
			if rng.IntN(40) == 0 {
				if err := l.Reset(ctx, subject); err != nil {
					t.Fatal(err)
				}
				if err := twin.Reset(ctx, subject); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if rng.IntN(10) == 0 {
				got, err1 := l.Peek(ctx, subject)
				want, err2 := twin.Peek(ctx, subject)
				if err1 != nil || err2 != nil || !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: peek %+v %v, twin %+v %v", what, got, err1, want, err2)
				}
				continue
			}
			cost := 1 + rng.Int64N(minCap)
			got, err1 := l.TryAcquireN(ctx, subject, cost)
			want, err2 := twin.TryAcquireN(ctx, subject, cost)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %v, %v", what, err1, err2)
			}
			checks++
			if got.Source != ratelimit.SourceCache {
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s: cost %d decided by the store as %+v, twin %+v", what, cost, got, want)
				}
				continue
			}
			hits++
			if want.Allowed || got.Allowed || got.RetryAfter > want.RetryAfter || got.RetryAfter <= 0 {
				t.Fatalf("%s: cost %d denied by the cache with %+v, but the store says %+v", what, cost, got, want)
			}
		}
		if st := l.DenyCacheStats(); st.Size > 4 || st.Capacity != 4 {
			t.Fatalf("%s: cache stats %+v, want at most 4 of capacity 4", fmt.Sprint("seq ", seq), st)
		}
	}
	t.Logf("the cache denied %d of %d checks", hits, checks)
	if hits < checks/20 {
		t.Fatalf("the cache denied %d of %d checks; the workload should give it more to do", hits, checks)
	}
}

func TestDenyCacheWithTheStoresOwnClock(t *testing.T) {
	// No WithClock: the store decides by its own clock, and the cache times
	// denials from time.Now read before the store is called. Nothing here
	// waits: an hour-long wait cannot pass during the test.
	store := &countingStore{Store: memstore.New()}
	l, err := ratelimit.New[string](store, ratelimit.PerHour(1), ratelimit.WithDenyCache(8))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l.TryAcquire(ctx, "s")
	first, _ := l.TryAcquire(ctx, "s")
	if first.Allowed || first.Source != ratelimit.SourceStore {
		t.Fatalf("second check = %+v, want denied by the store", first)
	}
	// The store's wait for one token, then the cache's, a moment later:
	// the cache's may only be shorter.
	peek, _ := l.Peek(ctx, "s")
	got, _ := l.TryAcquire(ctx, "s")
	if got.Source != ratelimit.SourceCache || got.Allowed {
		t.Fatalf("third check = %+v, want denied by the cache", got)
	}
	if got.RetryAfter > peek.RetryAfter || got.RetryAfter > first.RetryAfter || got.RetryAfter < first.RetryAfter-time.Second {
		t.Fatalf("cache's RetryAfter %v; the store's was %v and is now %v", got.RetryAfter, first.RetryAfter, peek.RetryAfter)
	}
	if n := store.Applies.Load(); n != 3 {
		t.Fatalf("the store saw %d checks, want 3 (two acquires and the peek)", n)
	}
}

func TestDenyCacheResetAndPeek(t *testing.T) {
	ctx := context.Background()
	t.Run("reset drops the entry", func(t *testing.T) {
		clock := testkit.NewClock(testkit.Start)
		l, store := cached(t, clock, 8, ratelimit.PerHour(1))
		runCache(t, l, clock, store, []cacheStep{
			{0, "s", 1, true, ratelimit.SourceStore, 0},
			{0, "s", 1, false, ratelimit.SourceStore, time.Hour},
			{0, "s", 1, false, ratelimit.SourceCache, time.Hour},
		})
		if err := l.Reset(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		if st := l.DenyCacheStats(); st.Size != 0 {
			t.Fatalf("after Reset the cache holds %d entries", st.Size)
		}
		runCache(t, l, clock, store, []cacheStep{{0, "s", 1, true, ratelimit.SourceStore, 0}})
	})
	t.Run("a denial in flight across a reset is not kept", func(t *testing.T) {
		clock := testkit.NewClock(testkit.Start)
		gate := &gated{Store: memstore.New(memstore.WithClock(clock.Now))}
		l, _ := ratelimit.New[string](gate, ratelimit.PerHour(1), ratelimit.WithClock(clock.Now), ratelimit.WithDenyCache(8))
		l.TryAcquire(ctx, "s")
		gate.hold()
		done := make(chan ratelimit.Decision)
		go func() {
			d, _ := l.TryAcquire(ctx, "s")
			done <- d
		}()
		gate.waitHeld()
		if err := l.Reset(ctx, "s"); err != nil {
			t.Fatal(err)
		}
		gate.release()
		if d := <-done; d.Allowed || d.Source != ratelimit.SourceStore {
			t.Fatalf("the check in flight = %+v, want denied by the store", d)
		}
		if st := l.DenyCacheStats(); st.Size != 0 {
			t.Fatalf("the cache kept a denial made before the reset: %+v", st)
		}
	})
	t.Run("peek asks the store and teaches the cache", func(t *testing.T) {
		clock := testkit.NewClock(testkit.Start)
		l, store := cached(t, clock, 8, ratelimit.PerMinute(2))
		l.TryAcquireN(ctx, "s", 2)
		for range 2 {
			before := store.Applies.Load()
			d, err := l.Peek(ctx, "s")
			if err != nil || d.Allowed || d.Source != ratelimit.SourceStore || d.RetryAfter != 30*time.Second {
				t.Fatalf("peek = %+v %v; want denied by the store, retry after 30s", d, err)
			}
			if store.Applies.Load() != before+1 {
				t.Fatal("peek did not reach the store")
			}
		}
		runCache(t, l, clock, store, []cacheStep{
			{time.Second, "s", 1, false, ratelimit.SourceCache, 29 * time.Second},
			{0, "s", 2, false, ratelimit.SourceCache, 29 * time.Second},
		})
	})
	t.Run("an admission that contradicts an entry drops it", func(t *testing.T) {
		clock := testkit.NewClock(testkit.Start)
		l, store := cached(t, clock, 8, ratelimit.PerMinute(10))
		runCache(t, l, clock, store, []cacheStep{
			{0, "s", 10, true, ratelimit.SourceStore, 0},
			{0, "s", 5, false, ratelimit.SourceStore, 30 * time.Second},
		})
		// Another process resets the bucket; this one cannot see it.
		if err := store.Store.Reset(ctx, l.Key("s")); err != nil {
			t.Fatal(err)
		}
		runCache(t, l, clock, store, []cacheStep{
			{0, "s", 1, false, ratelimit.SourceCache, 6 * time.Second},
			// Cost 1 is past its bound; the store admits it with 9
			// left, which proves the entry for cost 5 wrong.
			{6 * time.Second, "s", 1, true, ratelimit.SourceStore, 0},
			{0, "s", 5, true, ratelimit.SourceStore, 0},
		})
	})
}

func TestDenyCacheIsBoundedLRU(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	l, store := cached(t, clock, 2, ratelimit.PerHour(1))
	ctx := context.Background()
	for _, s := range []string{"a", "b", "c"} {
		l.TryAcquire(ctx, s)
		l.TryAcquire(ctx, s)
		if s == "b" {
			l.TryAcquire(ctx, "a") // a hit: a becomes the most recently used
		}
	}
	st := l.DenyCacheStats()
	if st.Size != 2 || st.Capacity != 2 || st.Evictions != 1 {
		t.Fatalf("stats after denying 3 subjects = %+v, want size 2 of 2, 1 eviction", st)
	}
	runCache(t, l, clock, store, []cacheStep{
		{0, "a", 1, false, ratelimit.SourceCache, time.Hour},
		{0, "c", 1, false, ratelimit.SourceCache, time.Hour},
		{0, "b", 1, false, ratelimit.SourceStore, time.Hour}, // b was evicted
	})
	// An entry that has run out is dropped when looked up, and does not
	// count as an eviction when it makes room.
	clock.Add(time.Hour)
	l.TryAcquire(ctx, "a")
	if st := l.DenyCacheStats(); st.Size != 2 || st.Evictions != 2 {
		t.Fatalf("stats = %+v, want 2 entries (a dropped, b evicting c) and 2 evictions", st)
	}
}

func TestDenyCacheStats(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	l, _ := cached(t, clock, 100, ratelimit.PerHour(1))
	ctx := context.Background()
	if st := l.DenyCacheStats(); st != (ratelimit.CacheStats{Capacity: 100}) || st.HitRate() != 0 {
		t.Fatalf("fresh stats = %+v (hit rate %v)", st, st.HitRate())
	}
	l.TryAcquire(ctx, "s") // miss, allowed
	l.TryAcquire(ctx, "s") // miss, denied
	l.TryAcquire(ctx, "s") // hit
	l.TryAcquire(ctx, "s") // hit
	st := l.DenyCacheStats()
	if st.Hits != 2 || st.Misses != 2 || st.Size != 1 || st.HitRate() != 0.5 {
		t.Fatalf("stats = %+v (hit rate %v), want 2 hits, 2 misses, 1 entry, rate 0.5", st, st.HitRate())
	}
	none, _ := ratelimit.New[string](memstore.New(), ratelimit.PerHour(1))
	if st := none.DenyCacheStats(); st != (ratelimit.CacheStats{}) {
		t.Fatalf("a limiter without a cache reports %+v", st)
	}
}

func TestDenyCacheKeepsOnlyTheStoresOwnDenials(t *testing.T) {
	ctx := context.Background()
	for _, tt := range []struct {
		name string
		d    ratelimit.Decision
		err  error
	}{
		{"a fail-closed denial", ratelimit.Decision{RetryAfter: time.Minute, Source: ratelimit.SourceFailClosed}, nil},
		{"a local fallback's denial", ratelimit.Decision{RetryAfter: time.Minute, Source: ratelimit.SourceLocal}, nil},
		{"an error", ratelimit.Decision{}, errors.New("unreachable")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fixed := &fixedStore{d: tt.d, err: tt.err}
			l, _ := ratelimit.New[string](fixed, ratelimit.PerMinute(1), ratelimit.WithDenyCache(8))
			for range 3 {
				l.TryAcquire(ctx, "s")
			}
			if fixed.calls != 3 || l.DenyCacheStats().Size != 0 {
				t.Fatalf("the store saw %d of 3 checks and the cache holds %d", fixed.calls, l.DenyCacheStats().Size)
			}
		})
	}
}

func TestLimiterOptionsAreChecked(t *testing.T) {
	for _, tt := range []struct {
		name string
		opt  ratelimit.Option
	}{
		{"deny cache of size 0", ratelimit.WithDenyCache(0)},
		{"deny cache of negative size", ratelimit.WithDenyCache(-1)},
		{"nil observer", ratelimit.WithObserver(nil)},
	} {
		if _, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1), tt.opt); !errors.Is(err, ratelimit.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", tt.name, err)
		}
	}
}

func TestDenyCacheUnderConcurrency(t *testing.T) {
	clock := testkit.NewClock(testkit.Start)
	l, store := cached(t, clock, 64, ratelimit.PerHour(50))
	ctx := context.Background()
	admitted := testkit.Concurrently(t, 8, 200, func(g, i int) (bool, error) {
		d, err := l.TryAcquire(ctx, fmt.Sprint("s", (g+i)%4))
		return d.Allowed, err
	})
	if admitted != 4*50 {
		t.Fatalf("admitted %d, want exactly 4 subjects × 50", admitted)
	}
	if n := store.Applies.Load(); n > 4*50+8*4*2 {
		t.Fatalf("the store saw %d of 1600 checks; the cache should have answered most denials", n)
	}
}

// fixedStore answers every check with the same decision or error.
type fixedStore struct {
	d     ratelimit.Decision
	err   error
	calls int
}

func (f *fixedStore) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	f.calls++
	return f.d, f.err
}

func (f *fixedStore) Reset(context.Context, string) error { return nil }

// gated is a Store whose checks can be held until released.
type gated struct {
	ratelimit.Store
	mu      sync.Mutex
	holding bool
	held    chan struct{}
	open    chan struct{}
}

func (g *gated) hold() {
	g.mu.Lock()
	g.holding, g.held, g.open = true, make(chan struct{}), make(chan struct{})
	g.mu.Unlock()
}

func (g *gated) waitHeld() { <-g.held }

func (g *gated) release() {
	g.mu.Lock()
	g.holding = false
	close(g.open)
	g.mu.Unlock()
}

func (g *gated) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	g.mu.Lock()
	holding, held, open := g.holding, g.held, g.open
	g.mu.Unlock()
	if !holding {
		return g.Store.Apply(ctx, key, r)
	}
	// Decide first, then wait: the answer is made before the reset, and
	// arrives after it.
	d, err := g.Store.Apply(ctx, key, r)
	close(held)
	<-open
	return d, err
}

// BenchmarkDenyCacheHit times a denied subject's checks in this process:
// answered by memstore (cache=0) or by the denial cache.
func BenchmarkDenyCacheHit(b *testing.B) {
	for _, size := range []int{0, 1000} {
		b.Run(fmt.Sprint("cache=", size), func(b *testing.B) {
			opts := []ratelimit.Option{}
			if size > 0 {
				opts = append(opts, ratelimit.WithDenyCache(size))
			}
			l, _ := ratelimit.New[string](memstore.New(), ratelimit.PerHour(1), opts...)
			ctx := context.Background()
			l.TryAcquire(ctx, "hot")
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if d, _ := l.TryAcquire(ctx, "hot"); d.Allowed {
						b.Fatal("allowed")
					}
				}
			})
		})
	}
}
