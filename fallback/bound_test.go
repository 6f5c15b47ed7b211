package fallback

import (
	"context"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/memstore"
)

// TestTheFleetBoundAcrossAnOutage runs the README's outage pattern
// (LocalFallback, its probe) on a fleet of replicas over one shared primary,
// for one subject of PerMinute(100) that every replica asks for as fast as
// it is allowed, every 50 ms of a 20 s window: the primary is down for the
// first 10 s and comes back empty. With WithFleetShare(n), as the README
// sets it, the fleet admits within the bound docs/outages.md states: the
// policy's allowance over the window, C + R·W/P, plus the local shares,
// n·⌊C/n⌋ + n·⌊R/n⌋·T/P. Without the share each replica's local bucket
// admits the whole policy, and the fleet passes that bound by about a
// capacity per replica beyond the first.
func TestTheFleetBoundAcrossAnOutage(t *testing.T) {
	const (
		window = 20 * time.Second
		outage = 10 * time.Second
		tick   = 50 * time.Millisecond
	)
	policy := ratelimit.PerMinute(100)
	c, r, p := policy.Capacity, policy.RefillTokens, policy.RefillPeriod
	allowance := c + r*int64(window)/int64(p) // 133
	for _, tc := range []struct {
		name     string
		replicas int
		share    bool
	}{
		{"2 replicas with the share", 2, true},
		{"4 replicas with the share", 4, true},
		{"2 replicas without it", 2, false},
		{"4 replicas without it", 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newFakeClock()
			primary := newFakePrimary(clock.Now)
			primary.set(refused)
			n := int64(tc.replicas)
			stores := make([]*Store, n)
			limiters := make([]*ratelimit.Limiter[string], n)
			for i := range stores {
				opts := []Option{WithOutage(LocalFallback), WithClock(clock.Now)}
				if tc.share {
					opts = append(opts, WithFleetShare(tc.replicas))
				}
				stores[i] = mustNew(t, primary, opts...)
				var err error
				limiters[i], err = ratelimit.New[string](stores[i], policy, ratelimit.WithClock(clock.Now), ratelimit.WithNamespace("api"))
				if err != nil {
					t.Fatal(err)
				}
			}
			var admitted, local int64
			for at := time.Duration(0); at < window; at += tick {
				if at == outage {
					primary.store = memstore.New(memstore.WithClock(clock.Now)) // back, empty
					primary.set(up)
					for _, s := range stores {
						s.Probe(ctx)
					}
				}
				for _, l := range limiters {
					for {
						d, err := l.TryAcquire(ctx, "user:42")
						if err != nil {
							t.Fatal(err)
						}
						if !d.Allowed {
							break
						}
						admitted++
						if d.Source == ratelimit.SourceLocal {
							local++
						}
					}
				}
				clock.Add(tick)
			}
			share := Share(policy, n)
			if !tc.share {
				share = policy
			}
			localBound := n*share.Capacity + n*share.RefillTokens*int64(outage)/int64(share.RefillPeriod)
			sharedBound := n*max(1, c/n) + n*max(1, r/n)*int64(outage)/int64(p)
			t.Logf("FIGURE %s: admitted %d in %v (%d locally, bound %d) where the policy allows %d; the bound with the share %d",
				tc.name, admitted, window, local, localBound, allowance, allowance+sharedBound)
			if local > localBound {
				t.Errorf("the local buckets admitted %d, above their bound %d", local, localBound)
			}
			switch over := admitted > allowance+sharedBound; {
			case tc.share && over:
				t.Errorf("admitted %d, above the bound %d + %d", admitted, allowance, sharedBound)
			case !tc.share && !over:
				t.Errorf("admitted %d without the share, within the bound with it (%d): the test shows nothing", admitted, allowance+sharedBound)
			}
		})
	}
}
