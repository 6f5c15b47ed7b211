package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// A free plan of 3 checks a minute and a pro plan of 60, free by default; a
// tenant upgraded to pro, and another given a policy of its own. With
// redisstore in place of memstore, every process sharing the Redis gives a
// tenant the same plan.
func ExampleNewPlans() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC) // a fixed clock, for the output
	clock := func() time.Time { return now }
	plans, err := ratelimit.NewPlans[string](memstore.New(), []ratelimit.Plan{
		{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}},
		{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerMinute(60)}},
	}, "free", ratelimit.WithNamespace("api"), ratelimit.WithClock(clock))
	if err != nil {
		panic(err) // an invalid plan: errors.Is(err, ratelimit.ErrInvalidArgument)
	}
	defer plans.Close()
	ctx := context.Background()
	check := func(tenant string) {
		plan, lim := plans.For(tenant) // the tenant's plan, without I/O
		d, err := lim.TryAcquire(ctx, tenant)
		if err != nil {
			panic(err) // the store could not decide
		}
		fmt.Printf("%s on %q: allowed=%v remaining=%d retry after %v\n", tenant, plan, d.Allowed, d.Remaining, d.RetryAfter)
	}
	for range 4 {
		check("acme")
	}
	if _, err := plans.Assign(ctx, "acme", ratelimit.Assignment{Plan: "pro"}); err != nil {
		panic(err)
	}
	// acme's bucket is empty and stays so under pro; its next token comes
	// on free's schedule, and pro's rate holds from then on.
	now = now.Add(20 * time.Second)
	check("acme")
	now = now.Add(time.Second)
	check("acme")

	// A policy of its own: 500 a second, with no plan defined for it.
	if _, err := plans.Assign(ctx, "globex", ratelimit.Assignment{Limits: []ratelimit.Limit{ratelimit.PerSecond(500)}}); err != nil {
		panic(err)
	}
	check("globex")
	// Output:
	// acme on "free": allowed=true remaining=2 retry after 0s
	// acme on "free": allowed=true remaining=1 retry after 0s
	// acme on "free": allowed=true remaining=0 retry after 0s
	// acme on "free": allowed=false remaining=0 retry after 20s
	// acme on "pro": allowed=true remaining=0 retry after 0s
	// acme on "pro": allowed=true remaining=0 retry after 0s
	// globex on "": allowed=true remaining=499 retry after 0s
}
