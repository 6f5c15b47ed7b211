package memstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// A request limited per client and per route at once is charged by both
// buckets or by neither.
func ExampleStore_ApplyAll() {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := memstore.New(memstore.WithClock(func() time.Time { return start }))
	ctx := context.Background()
	perClient := []ratelimit.Limit{ratelimit.PerMinute(3)}
	perRoute := []ratelimit.Limit{ratelimit.PerMinute(2)}
	check := func(client string) {
		items := []ratelimit.BatchItem{
			{Key: "6:client:" + client, Request: ratelimit.Request{Limits: perClient, Cost: 1}},
			{Key: "5:route:/search", Request: ratelimit.Request{Limits: perRoute, Cost: 1}},
		}
		if err := s.ApplyAll(ctx, items); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s: client %v (%d left), route %v (%d left)\n", client,
			items[0].Decision.Allowed, items[0].Decision.Remaining,
			items[1].Decision.Allowed, items[1].Decision.Remaining)
	}
	check("alice")
	check("bob")
	check("alice") // the route is spent: alice's bucket is not charged
	check("alice")
	// Output:
	// alice: client true (2 left), route true (1 left)
	// bob: client true (2 left), route true (0 left)
	// alice: client true (2 left), route false (0 left)
	// alice: client true (2 left), route false (0 left)
}
