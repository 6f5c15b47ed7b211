package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

func ExampleWithObserver() {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	// ObserverFuncs observes only the events it has a function for; package
	// promobserver turns every event into Prometheus series.
	counts := map[string]int{}
	obs := ratelimit.ObserverFuncs{
		Decision: func(_ context.Context, e ratelimit.DecisionEvent) {
			counts[fmt.Sprintf("%s allowed=%v source=%v", e.Namespace, e.Decision.Allowed, e.Decision.Source)]++
		},
	}
	limiter, _ := ratelimit.New[string](memstore.New(), ratelimit.PerMinute(2),
		ratelimit.WithNamespace("login"), ratelimit.WithClock(func() time.Time { return now }),
		ratelimit.WithObserver(obs), ratelimit.WithDenyCache(100))
	for range 5 {
		limiter.TryAcquire(context.Background(), "alice")
	}
	fmt.Println(counts["login allowed=true source=store"], counts["login allowed=false source=store"], counts["login allowed=false source=cache"])
	// Output:
	// 2 1 2
}
