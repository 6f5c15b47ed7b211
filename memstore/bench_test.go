package memstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

func BenchmarkHotSubject(b *testing.B) {
	l, _ := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(1_000_000_000))
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			l.TryAcquire(ctx, "hot")
		}
	})
}

// BenchmarkManySubjects checks 1,000,000 subjects in turn: "live" under a
// policy of 1000 an hour, so that every bucket stays; "refilled" under 1000 a
// second, so that most buckets are full again, swept out and made again by
// their next check (as in the in-process section of bench/).
func BenchmarkManySubjects(b *testing.B) {
	const n = 1_000_000
	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = "subject-" + strconv.Itoa(i)
	}
	for _, bc := range []struct {
		name  string
		limit ratelimit.Limit
	}{
		{"live", ratelimit.PerHour(1000)},
		{"refilled", ratelimit.PerSecond(1000)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s := memstore.New()
			l, _ := ratelimit.New[string](s, bc.limit)
			ctx := context.Background()
			before := testkit.LiveHeap()
			for _, sub := range subjects {
				l.TryAcquire(ctx, sub)
			}
			after := testkit.LiveHeap()
			if bc.name == "live" && s.Len() != n {
				b.Fatalf("store holds %d buckets, want %d", s.Len(), n)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.ReportMetric(float64(after-before)/n, "heap-B/subject")
			testkit.RunStrided(b, n, func(i int) { l.TryAcquire(ctx, subjects[i]) })
		})
	}
}

// BenchmarkManyPolicies checks one subject of each of n tenants in turn,
// each tenant with a namespace and a policy of its own: the cost of a check
// does not grow with the number of policies and namespaces.
func BenchmarkManyPolicies(b *testing.B) {
	for _, n := range []int{1, 1000, 10_000} {
		b.Run("policies="+strconv.Itoa(n), func(b *testing.B) {
			s := memstore.New()
			ctx := context.Background()
			limiters := make([]*ratelimit.Limiter[string], n)
			for i := range limiters {
				limiters[i], _ = ratelimit.New[string](s, ratelimit.PerSecond(int64(1_000_000_000+i)),
					ratelimit.WithNamespace("tenant-"+strconv.Itoa(i)))
				limiters[i].TryAcquire(ctx, "user")
			}
			if s.Len() != n {
				b.Fatalf("store holds %d buckets, want %d", s.Len(), n)
			}
			b.ReportAllocs()
			b.ResetTimer()
			testkit.RunStrided(b, n, func(i int) { limiters[i].TryAcquire(ctx, "user") })
		})
	}
}

// BenchmarkApplyAll decides two keys together, all or nothing.
func BenchmarkApplyAll(b *testing.B) {
	s := memstore.New()
	ctx := context.Background()
	limits := []ratelimit.Limit{ratelimit.PerSecond(1_000_000_000)}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		items := []ratelimit.BatchItem{
			{Key: "6:client:c1", Request: ratelimit.Request{Limits: limits, Cost: 1}},
			{Key: "5:route:/api", Request: ratelimit.Request{Limits: limits, Cost: 1}},
		}
		for pb.Next() {
			s.ApplyAll(ctx, items)
		}
	})
}

// BenchmarkHotDenied checks one subject under 1000 a second, as bench/'s
// in-process section does, so that nearly every check is denied: with the
// store's own clock, and with a clock that stands still (no clock read).
func BenchmarkHotDenied(b *testing.B) {
	frozen := time.Unix(1_800_000_000, 0)
	for _, bc := range []struct {
		name string
		opts []memstore.Option
	}{
		{"clock", nil},
		{"frozen", []memstore.Option{memstore.WithClock(func() time.Time { return frozen })}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			l, _ := ratelimit.New[string](memstore.New(bc.opts...), ratelimit.PerSecond(1000))
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l.TryAcquire(ctx, "hot-subject")
				}
			})
		})
	}
}
