package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

func ExampleWithDenyCache() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	// Remember the latest denial of up to 10,000 subjects in this process.
	limiter, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(1),
		ratelimit.WithClock(clock), ratelimit.WithDenyCache(10_000))
	ctx := context.Background()
	for range 3 {
		d, _ := limiter.TryAcquire(ctx, "mallory")
		fmt.Println(d.Allowed, d.Source, d.RetryAfter)
		now = now.Add(10 * time.Second)
	}
	now = now.Add(30 * time.Second) // the minute has passed: the store decides again
	d, _ := limiter.TryAcquire(ctx, "mallory")
	fmt.Println(d.Allowed, d.Source, d.RetryAfter)
	st := limiter.DenyCacheStats() // the run-out entry was dropped when looked up
	fmt.Printf("%d entries, %d hit, %d misses\n", st.Size, st.Hits, st.Misses)
	// Output:
	// true store 0s
	// false store 50s
	// false cache 40s
	// true store 0s
	// 0 entries, 1 hit, 3 misses
}
