package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

func ExampleLimiter_TryAcquireMany() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	limiter, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2),
		ratelimit.WithClock(func() time.Time { return now }))
	// One call, one round trip on Redis (one per master on a Cluster). The
	// items are independent decisions, not a transaction.
	results := limiter.TryAcquireMany(context.Background(), []ratelimit.Item[string]{
		{Subject: "alice", Cost: 2},
		{Subject: "bob", Cost: 1},
		{Subject: "alice", Cost: 1}, // alice spent her two above
		{Subject: "carol", Cost: 3}, // more than the capacity: never sent
	})
	for _, r := range results {
		if r.Err != nil {
			fmt.Println("error:", r.Err)
			continue
		}
		fmt.Println(r.Decision.Allowed, r.Decision.Remaining, r.Decision.RetryAfter)
	}
	// Output:
	// true 0 0s
	// true 1 0s
	// false 0 30s
	// error: ratelimit: invalid argument: cost must not exceed capacity (got 3 > 2)
}
