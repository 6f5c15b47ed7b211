package memstore_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
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

func BenchmarkManySubjects(b *testing.B) {
	const n = 1_000_000
	subjects := make([]string, n)
	for i := range subjects {
		subjects[i] = "subject-" + strconv.Itoa(i)
	}
	s := memstore.New()
	l, _ := ratelimit.New[string](s, ratelimit.PerHour(1000))
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for _, sub := range subjects {
		l.TryAcquire(ctx, sub)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if s.Len() != n {
		b.Fatalf("store holds %d buckets, want %d", s.Len(), n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "heap-B/subject")
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		i := int(time.Since(start).Nanoseconds()) // a different start per goroutine
		for pb.Next() {
			i = (i + 7919) % n
			l.TryAcquire(ctx, subjects[i])
		}
	})
}
