package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// A fleet throttling its own calls to a third-party API: each call waits for
// a token instead of being refused. Here the clock is injected and the sleep
// advances it, so the example runs at once; in production, leave out
// WithClock and WithSleep and use a shared store such as redisstore.
func ExampleLimiter_Wait() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	start := now
	clock := func() time.Time { return now }
	sleep := func(ctx context.Context, d time.Duration) error { now = now.Add(d); return ctx.Err() }
	limiter, err := ratelimit.New[string](memstore.New(memstore.WithClock(clock)), ratelimit.PerSecond(2),
		ratelimit.WithNamespace("upstream"), ratelimit.WithClock(clock), ratelimit.WithSleep(sleep))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range 4 {
		if _, err := limiter.Wait(ctx, "payments-api"); err != nil {
			fmt.Println("gave up:", err)
			return
		}
		// The jitter adds at most a tenth of the wait plus 1 ms.
		fmt.Printf("call %d after about %v\n", i+1, now.Sub(start).Truncate(500*time.Millisecond))
	}
	// Output:
	// call 1 after about 0s
	// call 2 after about 0s
	// call 3 after about 500ms
	// call 4 after about 1s
}
