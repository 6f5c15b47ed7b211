package ratelimit_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

func Example() {
	// A fixed clock makes the output deterministic; without WithClock the
	// store's own clock is used (the server's TIME for Redis).
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	limiter, err := ratelimit.New[string](memstore.New(), ratelimit.PerSecond(3),
		ratelimit.WithNamespace("api"), ratelimit.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for range 4 {
		d, err := limiter.TryAcquire(ctx, "user:42")
		if err != nil {
			panic(err) // the store could not decide
		}
		fmt.Printf("allowed=%v remaining=%d retry after %v\n", d.Allowed, d.Remaining, d.RetryAfter)
	}
	// Output:
	// allowed=true remaining=2 retry after 0s
	// allowed=true remaining=1 retry after 0s
	// allowed=true remaining=0 retry after 0s
	// allowed=false remaining=0 retry after 333.334ms
}

func ExampleLimiter_TryAcquireN() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	// 100 per second sustained, bursting to 200.
	limiter, _ := ratelimit.New[string](memstore.New(), ratelimit.NewLimit(100, time.Second, 200),
		ratelimit.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	d, _ := limiter.TryAcquireN(ctx, "client-7", 150) // a heavy request costs 150 tokens
	fmt.Println(d.Allowed, d.Remaining, d.ResetAfter)
	d, _ = limiter.TryAcquireN(ctx, "client-7", 100)
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	// Output:
	// true 50 1.5s
	// false 50 500ms
}

func ExampleNewMulti() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	// A login endpoint: 3 per minute and 10 per day, decided as one.
	perDay := ratelimit.NewLimit(10, 24*time.Hour, 10)
	limiter, _ := ratelimit.NewMulti[string](memstore.New(), []ratelimit.Limit{ratelimit.PerMinute(3), perDay},
		ratelimit.WithNamespace("login"), ratelimit.WithClock(func() time.Time { return now }))
	ctx := context.Background()
	for range 4 {
		d, _ := limiter.TryAcquire(ctx, "alice@example.com")
		fmt.Println(d.Allowed, d.Remaining, d.Limit)
	}
	// Output:
	// true 2 capacity 3, refill 3 per 1m
	// true 1 capacity 3, refill 3 per 1m
	// true 0 capacity 3, refill 3 per 1m
	// false 0 capacity 3, refill 3 per 1m
}

// Subjects of a type of your own: a named string type needs nothing, and any
// other type is keyed by a function of yours.
func ExampleNewEncoded() {
	type UserID string
	byName, _ := ratelimit.New[UserID](memstore.New(), ratelimit.PerMinute(10), ratelimit.WithNamespace("users"))
	fmt.Println(byName.Key("alice"))

	type Tenant struct {
		Org  string
		Team int
	}
	byTenant, _ := ratelimit.NewEncoded(memstore.New(), func(t Tenant) string { return t.Org + "/" + strconv.Itoa(t.Team) },
		[]ratelimit.Limit{ratelimit.PerHour(1000)}, ratelimit.WithNamespace("tenants"))
	fmt.Println(byTenant.Key(Tenant{"acme", 7}))
	// Output:
	// 5:users:alice
	// 7:tenants:acme/7
}
