package fallback

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

func TestApplySplitIsApplyOnTheJoinedKey(t *testing.T) {
	ctx := context.Background()
	const prefix, subject = "3:api:", "alice"
	clk := newFakeClock()
	partOf := func(_ context.Context, key string) string { return key[:1] }
	ping := func(context.Context, string) error { return nil }
	for _, tt := range []struct {
		name    string
		primary func() (ratelimit.Store, *fakePrimary)
		opts    []Option
	}{
		{"over a primary that takes split keys", func() (ratelimit.Store, *fakePrimary) {
			return memstore.New(memstore.WithClock(clk.Now)), nil
		}, nil},
		{"over a primary that needs the whole key", func() (ratelimit.Store, *fakePrimary) {
			p := newFakePrimary(clk.Now)
			return p, p
		}, nil},
		{"with partitions", func() (ratelimit.Store, *fakePrimary) {
			return memstore.New(memstore.WithClock(clk.Now)), nil
		}, []Option{withPartitions(partOf, ping)}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			primary, fake := tt.primary()
			s := mustNew(t, primary, append([]Option{WithOutage(LocalFallback), WithClock(clk.Now)}, tt.opts...)...)
			// Apply and ApplySplit take turns on one bucket: each sees what
			// the other took.
			check := func(source ratelimit.Source) {
				t.Helper()
				want := int64(99)
				for i := range 6 {
					var d ratelimit.Decision
					var err error
					if i%2 == 0 {
						d, err = s.applySplit(ctx, prefix, subject, req(perMinute100, 1, time.Time{}))
					} else {
						d, err = s.Apply(ctx, prefix+subject, req(perMinute100, 1, time.Time{}))
					}
					if err != nil || d.Remaining != want || d.Source != source {
						t.Fatalf("check %d: %+v, %v; want %d remaining from %v", i, d, err, want, source)
					}
					want--
				}
			}
			check(ratelimit.SourceStore)
			if d, err := primary.Apply(ctx, prefix+subject, ratelimit.Request{Limits: []ratelimit.Limit{perMinute100}, Peek: true}); err != nil || d.Remaining != 94 {
				t.Fatalf("the primary's bucket at the joined key: %+v, %v; want 94 remaining", d, err)
			}
			if fake != nil {
				fake.set(refused)
				if d, err := s.applySplit(ctx, prefix, subject, req(perMinute100, 1, time.Time{})); err != nil || d.Source != ratelimit.SourceLocal {
					t.Fatalf("the check that finds the primary refused: %+v, %v; want a local decision", d, err)
				}
				s.Local().Reset(ctx, prefix+subject)
			} else {
				s.MarkDown()
			}
			check(ratelimit.SourceLocal)
		})
	}
	t.Run("an invalid request is refused before anything is asked", func(t *testing.T) {
		p := newFakePrimary(clk.Now)
		s := mustNew(t, p)
		if _, err := s.applySplit(ctx, prefix, subject, req(perMinute100, 0, time.Time{})); err == nil || p.calls.Load() != 0 {
			t.Errorf("cost 0: %v after %d calls; want an invalid argument and no call", err, p.calls.Load())
		}
	})
}

// A Limiter over a fallback Store over a memstore.Store allocates no more
// per check than over the memstore.Store alone: no joined key, whether the
// primary or the local bucket decides.
func TestLimiterOverMemstoreAllocatesNoKey(t *testing.T) {
	ctx := context.Background()
	policy := ratelimit.PerSecond(1_000_000_000)
	allocs := func(store ratelimit.Store) float64 {
		lim, err := ratelimit.New[string](store, policy)
		if err != nil {
			t.Fatal(err)
		}
		const subject = "a-subject-long-enough-to-need-the-heap-when-joined"
		lim.TryAcquire(ctx, subject)
		return testing.AllocsPerRun(200, func() {
			if d, err := lim.TryAcquire(ctx, subject); err != nil || !d.Allowed {
				t.Fatalf("TryAcquire: %+v, %v", d, err)
			}
		})
	}
	base := allocs(memstore.New())
	s := mustNew(t, memstore.New(), WithOutage(LocalFallback))
	if got := allocs(s); got != base {
		t.Errorf("through the primary: %v allocations per check, want %v as over the memstore.Store alone", got, base)
	}
	s.MarkDown()
	if got := allocs(s); got != base {
		t.Errorf("through the local bucket: %v allocations per check, want %v as over the memstore.Store alone", got, base)
	}
}

// BenchmarkLimiterOverMemstore is a Limiter's check over a fallback Store
// over a memstore.Store, on many subjects (the fixture is checked to be
// filled), through the primary and through the local buckets.
func BenchmarkLimiterOverMemstore(b *testing.B) {
	const n = 100_000
	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = "subject-" + strconv.Itoa(i)
	}
	ctx := context.Background()
	for _, down := range []bool{false, true} {
		name := "primary"
		if down {
			name = "local"
		}
		b.Run(name, func(b *testing.B) {
			primary := memstore.New()
			s := mustNew(b, primary, WithOutage(LocalFallback))
			lim, err := ratelimit.New[string](s, ratelimit.PerHour(1_000_000))
			if err != nil {
				b.Fatal(err)
			}
			filled := primary
			if down {
				s.MarkDown()
				filled = s.Local()
			}
			for _, sub := range subjects {
				lim.TryAcquire(ctx, sub)
			}
			if filled.Len() != n {
				b.Fatalf("the deciding store holds %d buckets, want %d", filled.Len(), n)
			}
			b.ReportAllocs()
			b.ResetTimer()
			testkit.RunStrided(b, n, func(i int) { lim.TryAcquire(ctx, subjects[i]) })
		})
	}
}
