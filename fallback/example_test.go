package fallback_test

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/fallback"
	"github.com/exactlimit/ratelimit/memstore"
)

// unreachable is a Store whose server refuses every connection, standing in
// for a redisstore.Store whose Redis is down.
type unreachable struct{}

func (unreachable) Apply(context.Context, string, ratelimit.Request) (ratelimit.Decision, error) {
	return ratelimit.Decision{}, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

func (unreachable) Reset(context.Context, string) error {
	return &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
}

// A fleet of 4 processes shares 100 checks a minute. While the store is
// down, each process limits from its own bucket holding a quarter of the
// policy.
func Example() {
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store, _ := fallback.New(unreachable{},
		fallback.WithOutage(fallback.LocalFallback),
		fallback.WithFleetShare(4),
		fallback.WithClock(clock),
	)
	limiter, _ := ratelimit.New[string](store, ratelimit.PerMinute(100), ratelimit.WithClock(clock))

	ctx := context.Background()
	d, _ := limiter.TryAcquire(ctx, "alice")
	fmt.Println(d.Allowed, d.Remaining, d.Limit, d.Source, store.IsAlive())
	for range 24 {
		limiter.TryAcquire(ctx, "alice")
	}
	d, _ = limiter.TryAcquire(ctx, "alice")
	fmt.Println(d.Allowed, d.RetryAfter, d.Source)
	// Output:
	// true 24 capacity 25, refill 25 per 1m local false
	// false 2.4s local
}

// Each outage behaviour answers a check on a store that cannot be reached.
func Example_behaviours() {
	ctx := context.Background()
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 1, Now: time.Unix(1e9, 0)}
	for _, o := range []fallback.Outage{fallback.ReturnError, fallback.FailOpen, fallback.FailClosed, fallback.LocalFallback} {
		store, _ := fallback.New(unreachable{}, fallback.WithOutage(o))
		d, err := store.Apply(ctx, "k", r)
		fmt.Printf("%-14s allowed=%-5v source=%-11v enforced=%-5v err=%v\n", o, d.Allowed, d.Source, d.Enforced(), err)
	}
	// Output:
	// return-error   allowed=false source=store       enforced=true  err=ratelimit: store unavailable: dial tcp: connection refused
	// fail-open      allowed=true  source=fail-open   enforced=false err=<nil>
	// fail-closed    allowed=false source=fail-closed enforced=false err=<nil>
	// local-fallback allowed=true  source=local       enforced=true  err=<nil>
}

// The caller owns the probe's goroutine and stops it with its context.
func ExampleStore_ProbeForever() {
	store, _ := fallback.New(memstore.New(), fallback.WithOutage(fallback.LocalFallback))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		store.ProbeForever(ctx, fallback.DefaultProbeInterval, func(alive bool) {
			// export alive as a gauge
		})
	}()
	store.MarkDown()
	for !store.IsAlive() { // the probe finds the store again
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	<-done
	fmt.Println(store.IsAlive(), store.Probing())
	// Output: true false
}
