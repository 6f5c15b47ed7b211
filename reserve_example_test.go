package ratelimit_test

import (
	"context"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// A gateway in front of a language model limits each tenant to 3 requests
// and 1,000 tokens a minute. A call's tokens are known only when its answer
// arrives: it reserves one request and an estimate (the prompt's tokens and
// max_tokens), then settles what the answer's usage says.
func ExampleLimiter_Reserve() {
	ctx := context.Background()
	requests, tokens := ratelimit.PerMinute(3), ratelimit.PerMinute(1000)
	limiter, err := ratelimit.NewMulti[string](memstore.New(), []ratelimit.Limit{requests, tokens})
	if err != nil {
		panic(err)
	}
	rv, err := limiter.Reserve(ctx, "tenant-7", 5*time.Minute, 1, 600)
	if err != nil {
		panic(err)
	}
	if !rv.Decision.Allowed {
		fmt.Println("429, retry after", rv.Decision.RetryAfter)
		return
	}
	// ... call the model; its answer used 250 tokens ...
	d, err := rv.Settle(ctx, 1, 250)
	if err != nil {
		panic(err)
	}
	fmt.Println("requests left:", d.Remaining) // the scarcer of the two limits
	// 750 tokens are left, not 400: a second call of the same estimate fits.
	again, err := limiter.Reserve(ctx, "tenant-7", 5*time.Minute, 1, 600)
	if err != nil {
		panic(err)
	}
	fmt.Println("second call admitted:", again.Decision.Allowed)
	// Output:
	// requests left: 2
	// second call admitted: true
}
