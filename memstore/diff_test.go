package memstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/storehook"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// randomKeys returns keys of every shape the store files differently: two
// namespaces and no namespace, and subjects of each length class (up to 15
// bytes, 16 to 39, 40 and more), at the class edges and at 8 bytes, where a
// short subject's key changes form.
func randomKeys() []string {
	var keys []string
	for _, prefix := range []string{"2:ns:", "5:other:", ""} {
		for _, n := range []int{1, 2, 7, 8, 9, 10, 15, 16, 39, 40, 70} {
			// Subjects that differ in their last byte, in their first, one
			// that ends in a zero byte, and one that is all the same byte.
			keys = append(keys, prefix+strings.Repeat("s", n-1)+"1", prefix+strings.Repeat("s", n-1)+"2",
				prefix+"1"+strings.Repeat("s", n-1), prefix+strings.Repeat("s", n-1)+"\x00", prefix+strings.Repeat("s", n))
		}
		keys = append(keys, prefix+"\x00")
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// randomPolicies is a pool of policies of one to three limits that share
// some limits, so that checks change a bucket's policy in every way Step
// knows.
var randomPolicies = [][]ratelimit.Limit{
	{ratelimit.PerSecond(5)},
	{ratelimit.NewLimit(3, time.Second, 7)},
	{ratelimit.PerSecond(5), ratelimit.PerMinute(20)},
	{ratelimit.PerMinute(20), ratelimit.PerSecond(5)},
	{ratelimit.NewLimit(1, 300*time.Millisecond, 2), ratelimit.PerSecond(5), ratelimit.PerHour(50)},
	{ratelimit.NewLimit(7, 3*time.Microsecond, 9)},
}

// TestApplyEqualsStep holds memstore equal to the pure Step on random
// sequences of checks, peeks, policy changes, resets and sweeps, with times
// going back as well as forward.
func TestApplyEqualsStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		// frozen: the store's clock stands still, so that no bucket expires,
		// and the requests carry their own times, going back as well.
		// Otherwise the store's clock is the requests' time, and moves
		// forward only, past many buckets' expiry.
		frozen bool
	}{
		{"with requests carrying their own time", true},
		{"on the store's clock, with buckets expiring", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			clock := testkit.NewClock(testkit.Start)
			storeClock := clock.Now
			if tc.frozen {
				storeClock = func() time.Time { return testkit.Start }
			}
			s := memstore.New(memstore.WithClock(storeClock))
			ctx := context.Background()
			keys := randomKeys()
			model := map[string]*tokenbucket.State{}
			now := testkit.Start
			for i := range 40_000 {
				// Mostly a few neighbouring keys at a time (subjects that
				// differ by a byte, or by their length), so that their
				// buckets are seldom full again when checked.
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(4) != 0 {
					key = keys[(i/400+rng.IntN(4))%len(keys)]
				}
				switch rng.IntN(100) {
				case 0:
					if err := s.Reset(ctx, key); err != nil {
						t.Fatal(err)
					}
					delete(model, key)
					continue
				case 1:
					s.Sweep()
					continue
				}
				now = memstore.RandomStep(rng, now, tc.frozen)
				clock.Add(now.Sub(clock.Now()))
				limits := randomPolicies[rng.IntN(len(randomPolicies))]
				minCap := limits[0].Capacity
				for _, l := range limits {
					minCap = min(minCap, l.Capacity)
				}
				r := ratelimit.Request{Limits: limits, Cost: 1 + rng.Int64N(minCap), Peek: rng.IntN(5) == 0}
				if tc.frozen {
					r.Now = now
				}
				st := model[key]
				if st == nil {
					st = &tokenbucket.State{}
				}
				us := now.UnixMicro()
				want, _, write := st.Step(r, us)
				if write {
					model[key] = st
				}
				what := fmt.Sprintf("check %d on %q (%v, cost %d, peek %v)", i, key, limits, r.Cost, r.Peek)
				var got ratelimit.Decision
				var err error
				if prefix, subject, ok := cut(key); ok && rng.IntN(2) == 0 {
					got, err = storehook.Split[ratelimit.Request, ratelimit.Decision](s)(ctx, prefix, subject, r)
				} else {
					got, err = s.Apply(ctx, key, r)
				}
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s = %+v, Step says %+v", what, got, want)
				}
			}
		})
	}
}

// cut splits a key with a namespace after its prefix.
func cut(key string) (prefix, subject string, ok bool) {
	for _, p := range []string{"2:ns:", "5:other:"} {
		if rest, found := strings.CutPrefix(key, p); found {
			return p, rest, true
		}
	}
	return "", key, false
}
