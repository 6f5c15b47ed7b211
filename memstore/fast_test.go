package memstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// RandomStep returns now moved on by a random step, for the differential
// tests: mostly a few ms, now and then a few hundred ms or seconds, and with
// back, also a few hundred ms back now and then.
func RandomStep(rng *rand.Rand, now time.Time, back bool) time.Time {
	switch step := rng.IntN(20); {
	case step < 12:
		return now.Add(time.Duration(rng.IntN(20_000)) * time.Microsecond)
	case step < 16:
		return now.Add(time.Duration(rng.IntN(400_000)) * time.Microsecond)
	case step < 18 && back:
		return now.Add(-time.Duration(rng.IntN(400_000)) * time.Microsecond)
	case step < 19:
		return now.Add(time.Duration(rng.IntN(5)) * time.Second)
	}
	return now
}

// TestFastDecisionsEqualStep holds the decisions made without the lock equal
// to Step, on random sequences of checks of a few short subjects, with
// policies changing, resets, sweeps, refunds and all-or-nothing batches
// writing the buckets the shards have published, and times going back as well as
// forward. Before each check it asks the shard whether it would decide
// without the lock, and what.
func TestFastDecisionsEqualStep(t *testing.T) {
	policies := [][]ratelimit.Limit{
		{ratelimit.PerSecond(5)},
		{ratelimit.PerSecond(5)},
		{ratelimit.NewLimit(3, time.Second, 7)},
		{ratelimit.NewLimit(7, 3*time.Microsecond, 9)},
		{ratelimit.PerSecond(5), ratelimit.PerMinute(20)},
	}
	keys := []string{"2:ns:a", "2:ns:b", "2:ns:a subject 15", "5:other:a", "2:ns:a longer subject, of 30 b"}
	for _, frozen := range []bool{true, false} {
		t.Run(fmt.Sprintf("frozen=%v", frozen), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			clock := testkit.NewClock(testkit.Start)
			storeClock := clock.Now
			if frozen {
				storeClock = func() time.Time { return testkit.Start }
			}
			s := New(WithClock(storeClock))
			ctx := context.Background()
			model := map[string]*tokenbucket.State{}
			now := testkit.Start
			fast := 0
			const checks = 40_000
			for i := range checks {
				key := keys[rng.IntN(len(keys))]
				if rng.IntN(8) != 0 {
					key = keys[(i/500)%len(keys)] // a hot key for a while
				}
				switch rng.IntN(200) {
				case 0:
					s.Reset(ctx, key)
					delete(model, key)
					continue
				case 1:
					s.Sweep()
					continue
				}
				now = RandomStep(rng, now, frozen)
				clock.Add(now.Sub(clock.Now()))
				limits := policies[0]
				if rng.IntN(10) == 0 {
					limits = policies[rng.IntN(len(policies))]
				}
				minCap := limits[0].Capacity
				for _, l := range limits {
					minCap = min(minCap, l.Capacity)
				}
				r := ratelimit.Request{Limits: limits, Cost: 1 + rng.Int64N(minCap), Peek: rng.IntN(8) == 0}
				if len(limits) == 1 && rng.IntN(10) == 0 {
					// A cost of its own for the limit, not r.Cost.
					r.Cost, r.Costs = 1, []int64{1 + rng.Int64N(minCap)}
				}
				if frozen {
					r.Now = now
				}
				us := now.UnixMicro()
				what := fmt.Sprintf("check %d on %q (%v, cost %d, peek %v)", i, key, limits, r.Cost, r.Peek)
				if !r.Peek && rng.IntN(50) == 0 {
					// A refund writes the bucket outside a check.
					st := model[key]
					if st == nil {
						st = &tokenbucket.State{}
					}
					want, _, write := st.Refund(r, us)
					if write {
						model[key] = st
					}
					got, err := s.Refund(ctx, key, r)
					if err != nil || !reflect.DeepEqual(got, want) {
						t.Fatalf("refund %s = %+v, %v; Refund says %+v", what, got, err, want)
					}
					continue
				}
				if rng.IntN(50) == 0 {
					// key together with another, all or nothing.
					other := keys[(i/500+1)%len(keys)]
					if other == key {
						continue
					}
					items := []ratelimit.BatchItem{{Key: key, Request: r}, {Key: other, Request: r}}
					var sts []*tokenbucket.State
					for _, k := range []string{key, other} {
						if model[k] == nil {
							model[k] = &tokenbucket.State{}
						}
						st := model[k]
						sts = append(sts, &tokenbucket.State{Last: st.Last, Bands: append([]tokenbucket.Band(nil), st.Bands...)})
					}
					ds := make([]ratelimit.Decision, 2)
					ttls := make([]time.Duration, 2)
					if tokenbucket.StepAll(sts, []ratelimit.Request{r, r}, us, ds, ttls) {
						model[key], model[other] = sts[0], sts[1]
					}
					if err := s.ApplyAll(ctx, items); err != nil {
						t.Fatalf("%s with %q: %v", what, other, err)
					}
					for j := range items {
						if !reflect.DeepEqual(items[j].Decision, ds[j]) {
							t.Fatalf("%s with %q: item %d = %+v, StepAll says %+v", what, other, j, items[j].Decision, ds[j])
						}
					}
					continue
				}
				st := model[key]
				if st == nil {
					st = &tokenbucket.State{}
				}
				want, _, write := st.Step(r, us)
				if write {
					model[key] = st
				}
				prefix, subject := keyfmt.Split(key)
				if len(subject) <= maxShort {
					var d ratelimit.Decision
					k0, k1 := shortWords(subject)
					if s.shardOf(prefix, subject).decideFast(prefix, k0, k1, &r, us, &d) {
						fast++
						if write || !reflect.DeepEqual(d, want) {
							t.Fatalf("%s decided without the lock: %+v, Step says %+v (write %v)", what, d, want, write)
						}
					}
				}
				got, err := s.Apply(ctx, key, r)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%s = %+v, Step says %+v", what, got, want)
				}
			}
			t.Logf("%d of %d checks decided without the lock", fast, checks)
			if fast < checks/10 {
				t.Fatalf("%d of %d checks decided without the lock: the test does not exercise it", fast, checks)
			}
		})
	}
}

// TestHotSubjectAdmitsExactlyItsCapacity checks one subject from several
// goroutines at once, at an instant that stands still, while other subjects
// of its shard come and go: however the checks interleave, exactly the
// capacity is admitted.
func TestHotSubjectAdmitsExactlyItsCapacity(t *testing.T) {
	s := New(WithClock(func() time.Time { return testkit.Start }))
	ctx := context.Background()
	const capacity, goroutines, checks = 1000, 4, 20_000
	r := ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.NewLimit(1, time.Hour, capacity)}, Cost: 1}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range checks {
				key := "1:a:hot"
				if i%100 == 0 {
					key = fmt.Sprintf("1:a:%d-%d", g, i) // a bucket added
				}
				d, err := s.Apply(ctx, key, r)
				if err != nil {
					t.Error(err)
					return
				}
				if key == "1:a:hot" && d.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if got := allowed.Load(); got != capacity {
		t.Fatalf("%d checks admitted at one instant, want the capacity, %d", got, capacity)
	}
	if d, _ := s.Apply(ctx, "1:a:hot", ratelimit.Request{Limits: r.Limits, Peek: true}); d.Allowed || d.Remaining != 0 {
		t.Fatalf("peek after the capacity was taken: %+v", d)
	}
}

// TestHotSubjectNeverAdmitsMoreThanItsRate checks one subject from several
// goroutines on a clock that each check moves on: the admissions never
// exceed the capacity plus the refill over the time the clock went.
func TestHotSubjectNeverAdmitsMoreThanItsRate(t *testing.T) {
	var ticks atomic.Int64
	s := New(WithClock(func() time.Time { return testkit.Start.Add(time.Duration(ticks.Add(1)) * time.Microsecond) }))
	ctx := context.Background()
	const goroutines, checks = 4, 20_000
	limit := ratelimit.NewLimit(1, time.Millisecond, 5) // 1 a ms, 5 at once
	r := ratelimit.Request{Limits: []ratelimit.Limit{limit}, Cost: 1}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range checks {
				if d, err := s.Apply(ctx, "1:a:hot", r); err != nil {
					t.Error(err)
					return
				} else if d.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Duration(ticks.Load()) * time.Microsecond
	most := limit.Capacity + int64(elapsed/time.Millisecond)
	if got := allowed.Load(); got > most || got < most/2 {
		t.Fatalf("%d checks admitted over %v at %v, want at most %d (and not under half of it)", got, elapsed, limit, most)
	}
}
