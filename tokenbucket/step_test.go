package tokenbucket

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
)

// op is one check in a step table: at t microseconds, take cost (or peek)
// under limits (the table's policy when nil), and expect the decision.
type op struct {
	t       int64
	cost    int64
	peek    bool
	limits  []ratelimit.Limit
	allowed bool
	remain  int64
	retry   time.Duration
	reset   time.Duration
}

const t0 = int64(1_700_000_000_000_000) // a realistic time in µs

func runSteps(t *testing.T, policy []ratelimit.Limit, ops []op) {
	t.Helper()
	var st State
	for i, o := range ops {
		limits := o.limits
		if limits == nil {
			limits = policy
		}
		r := ratelimit.Request{Limits: limits, Cost: o.cost, Peek: o.peek}
		if err := r.Validate(); err != nil {
			t.Fatalf("step %d: invalid request: %v", i, err)
		}
		d, ttl, _ := st.Step(r, t0+o.t)
		if d.Allowed != o.allowed || d.Remaining != o.remain || d.RetryAfter != o.retry || d.ResetAfter != o.reset {
			t.Fatalf("step %d at +%dµs cost %d peek %v: got allowed=%v remaining=%d retry=%v reset=%v, want allowed=%v remaining=%d retry=%v reset=%v",
				i, o.t, o.cost, o.peek, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, o.allowed, o.remain, o.retry, o.reset)
		}
		// The key lives until the bucket is full, rounded up to the
		// millisecond once: never shorter, and never a millisecond longer.
		want := max(time.Millisecond, (d.ResetAfter + time.Millisecond - 1).Truncate(time.Millisecond))
		if ttl != want {
			t.Fatalf("step %d: ttl %v, want %v (the reset %v rounded up to the ms, at least 1ms)", i, ttl, want, d.ResetAfter)
		}
	}
}

func TestStepSmoothRefillCarriesTheRemainder(t *testing.T) {
	// 3 tokens every 10 µs: one token per 3⅓ µs. A stepped or rounded
	// refill would lose or double-count the thirds.
	l := []ratelimit.Limit{{Capacity: 3, RefillTokens: 3, RefillPeriod: 10 * time.Microsecond}}
	runSteps(t, l, []op{
		{t: 0, cost: 3, allowed: true, remain: 0, reset: 10 * time.Microsecond},
		// After 3 µs: 0.9 tokens, not enough; one is there after 4 µs (⌈10/3⌉).
		{t: 3, cost: 1, allowed: false, remain: 0, retry: 1 * time.Microsecond, reset: 7 * time.Microsecond},
		{t: 4, cost: 1, allowed: true, remain: 0, reset: 10 * time.Microsecond},
		// The 0.2 token left over at 4 µs is carried: the next token needs
		// 0.8 more, 2.67 µs, so it is there at 7 µs, not 8.
		{t: 6, cost: 1, allowed: false, remain: 0, retry: 1 * time.Microsecond, reset: 8 * time.Microsecond},
		{t: 7, cost: 1, allowed: true, remain: 0, reset: 10 * time.Microsecond},
		// Peeking does not take, and reports the wait for one token.
		{t: 8, peek: true, allowed: false, remain: 0, retry: 2 * time.Microsecond, reset: 9 * time.Microsecond},
		{t: 17, peek: true, allowed: true, remain: 3},
		{t: 17, cost: 2, allowed: true, remain: 1, reset: 7 * time.Microsecond},
	})
}

func TestStepDenialConsumesNothing(t *testing.T) {
	runSteps(t, []ratelimit.Limit{ratelimit.PerSecond(10)}, []op{
		{t: 0, cost: 8, allowed: true, remain: 2, reset: 800 * time.Millisecond},
		{t: 0, cost: 5, allowed: false, remain: 2, retry: 300 * time.Millisecond, reset: 800 * time.Millisecond},
		{t: 0, cost: 5, allowed: false, remain: 2, retry: 300 * time.Millisecond, reset: 800 * time.Millisecond},
		{t: 0, cost: 2, allowed: true, remain: 0, reset: time.Second},
	})
}

func TestStepNoDriftOverManySteps(t *testing.T) {
	// 7 tokens per 3 seconds on an emptied bucket, taken one at a time as
	// soon as each is there: the n-th must come exactly at ⌈n*3s/7⌉.
	l := ratelimit.Limit{Capacity: 5, RefillTokens: 7, RefillPeriod: 3 * time.Second}
	var st State
	if d, _, _ := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{l}, Cost: 5}, t0); !d.Allowed {
		t.Fatal("a full bucket denied its capacity")
	}
	r := ratelimit.Request{Limits: []ratelimit.Limit{l}, Cost: 1}
	now := t0
	for n := int64(1); n <= 100_000; n++ {
		d, _, _ := st.Step(r, now)
		if d.Allowed {
			t.Fatalf("token %d was there before its time", n)
		}
		now += d.RetryAfter.Microseconds()
		if d, _, _ = st.Step(r, now); !d.Allowed {
			t.Fatalf("token %d denied after waiting RetryAfter", n)
		}
		if want := t0 + arith.CeilDiv(n*3_000_000, 7); now != want {
			t.Fatalf("token %d taken at +%dµs, want +%dµs (drift %dµs)", n, now-t0, want-t0, now-want)
		}
	}
}

func TestStepExactAtTheLargestSizes(t *testing.T) {
	// Capacity * period = 2^52 exactly, one token per 2^20 µs.
	l := ratelimit.Limit{Capacity: 1 << 32, RefillTokens: 1, RefillPeriod: 1 << 20 * time.Microsecond}
	runSteps(t, []ratelimit.Limit{l}, []op{
		{t: 0, cost: 1 << 32, allowed: true, remain: 0, reset: (1 << 52) * time.Microsecond},
		{t: 1<<20 - 1, cost: 1, allowed: false, remain: 0, retry: time.Microsecond, reset: (1<<52 - 1<<20 + 1) * time.Microsecond},
		{t: 1 << 20, cost: 1, allowed: true, remain: 0, reset: (1 << 52) * time.Microsecond},
	})
	// A refill rate of 2^52 tokens per µs refills any bucket in one µs.
	big := ratelimit.Limit{Capacity: 1 << 52, RefillTokens: 1 << 52, RefillPeriod: time.Microsecond}
	runSteps(t, []ratelimit.Limit{big}, []op{
		{t: 0, cost: 1 << 52, allowed: true, remain: 0, reset: time.Microsecond},
		{t: 1, cost: 1 << 52, allowed: true, remain: 0, reset: time.Microsecond},
	})
}

func TestStepBackwardClock(t *testing.T) {
	runSteps(t, []ratelimit.Limit{ratelimit.PerSecond(10)}, []op{
		{t: 1_000_000, cost: 10, allowed: true, remain: 0, reset: time.Second},
		// The clock jumps back 500 ms: nothing is credited, and the wait
		// counts from the bucket's own time.
		{t: 500_000, cost: 1, allowed: false, remain: 0, retry: 600 * time.Millisecond, reset: 1500 * time.Millisecond},
		// Forward again, 100 ms after the bucket's time: one token.
		{t: 1_100_000, cost: 1, allowed: true, remain: 0, reset: time.Second},
	})
}

func TestStepPolicyChange(t *testing.T) {
	old := []ratelimit.Limit{ratelimit.PerSecond(10)}
	bigger := []ratelimit.Limit{ratelimit.PerSecond(100)}
	smaller := []ratelimit.Limit{ratelimit.PerSecond(4)}
	runSteps(t, old, []op{
		{t: 0, cost: 3, allowed: true, remain: 7, reset: 300 * time.Millisecond},
		// 50 ms later the old policy has refilled half a token: 7.5. The
		// new one is credited those 50 ms at the old rate and carries the
		// 7.5 tokens over.
		{t: 50_000, cost: 1, limits: bigger, allowed: true, remain: 6, reset: 935 * time.Millisecond},
		// Back on the old policy 10 ms later: the 10 ms are credited at the
		// rate of the policy that wrote the bucket (100/s, one token), then
		// the lesser of 7.5 and 10 is carried over.
		{t: 60_000, cost: 1, allowed: true, remain: 6, reset: 350 * time.Millisecond},
		// A smaller policy caps the tokens at its capacity: 4 of 6.5.
		{t: 60_000, cost: 1, limits: smaller, allowed: true, remain: 3, reset: 250 * time.Millisecond},
	})
}

func TestStepAlternatingPoliciesNeverMint(t *testing.T) {
	a, b := []ratelimit.Limit{ratelimit.PerSecond(10)}, []ratelimit.Limit{ratelimit.NewLimit(1, time.Second, 20)}
	var st State
	admitted := 0
	for i := range 1000 {
		p := a
		if i%2 == 1 {
			p = b
		}
		d, _, _ := st.Step(ratelimit.Request{Limits: p, Cost: 1}, t0+int64(i)) // 1 ms of the fleet's time
		if d.Allowed {
			admitted++
		}
	}
	// Within one millisecond neither policy refills a whole token: only the
	// first full bucket (10 tokens) can be spent.
	if admitted > 10 {
		t.Fatalf("alternating policies admitted %d, want at most 10", admitted)
	}
}

func TestStepFullBucketIsLikeAMissingOne(t *testing.T) {
	runSteps(t, []ratelimit.Limit{ratelimit.PerSecond(10)}, []op{
		{t: 0, cost: 10, allowed: true, remain: 0, reset: time.Second},
		// A second later the bucket is full under its own policy: a new
		// policy meets a missing bucket and starts full at its capacity.
		{t: 1_000_000, cost: 1, limits: []ratelimit.Limit{ratelimit.PerSecond(100)}, allowed: true, remain: 99, reset: 10 * time.Millisecond},
	})
}

func TestStepPeekAtMissingBucketWritesNothing(t *testing.T) {
	var st State
	d, _, write := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(5)}, Peek: true}, t0)
	if !d.Allowed || d.Remaining != 5 || write || len(st.Bands) != 0 {
		t.Fatalf("peek at a missing bucket = %+v write=%v state=%+v, want allowed, 5 remaining, nothing written", d, write, st)
	}
}

func TestStepMultipleLimits(t *testing.T) {
	perMin := ratelimit.Limit{Capacity: 5, RefillTokens: 5, RefillPeriod: time.Minute}
	perDay := ratelimit.Limit{Capacity: 100, RefillTokens: 100, RefillPeriod: 24 * time.Hour}
	policy := []ratelimit.Limit{perMin, perDay}
	var st State
	for i := range 5 {
		d, _, _ := st.Step(ratelimit.Request{Limits: policy, Cost: 1}, t0)
		if !d.Allowed || d.Remaining != int64(4-i) || d.Limit != perMin {
			t.Fatalf("check %d = %+v, want allowed with %d remaining bound by the minute limit", i, d, 4-i)
		}
	}
	d, _, _ := st.Step(ratelimit.Request{Limits: policy, Cost: 1}, t0)
	if d.Allowed || d.Limit != perMin || d.RetryAfter != 12*time.Second {
		t.Fatalf("sixth check = %+v, want denied by the minute limit, retry after 12s", d)
	}
	// The denial took nothing from the day's band.
	if got := st.Bands[1].Level / rateOf(perDay).P; got != 95 {
		t.Fatalf("day band holds %d tokens, want 95", got)
	}
	if d.ResetAfter != 5*24*time.Hour/100 {
		t.Fatalf("reset after %v, want the day band's %v", d.ResetAfter, 5*24*time.Hour/100)
	}
}

// modelSteps is how many random checks TestStepProperties makes in all;
// -model.steps=200000 runs many more than CI does.
var modelSteps = flag.Int("model.steps", 60_000, "random checks of TestStepProperties")

// TestStepProperties checks, over random operations, the invariants that
// hold whatever the arithmetic: a bucket never holds more than its capacity,
// a denial takes nothing, the ttl is the reset rounded up once, and over any
// run the tokens taken never exceed the capacity plus the refill of the time
// the clock moved forward. The policies include daily and hourly quotas of
// millions, and the clock sometimes steps back: a clock behind a bucket
// credits nothing, but a bucket that is full by then is a missing one (it
// keeps no key), so a clock that steps back and forward again across the
// same time may be credited it twice, as the forward travel counts it.
func TestStepProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	big := []ratelimit.Limit{ratelimit.PerDay(1_000_000), ratelimit.PerHour(10_000_000), ratelimit.NewLimit(7, 24*time.Hour, 104_249), ratelimit.NewLimit(100_000, 30*24*time.Hour, 100_000)}
	const perTrial = 300
	for trial := range max(1, *modelSteps/perTrial) {
		l := ratelimit.Limit{
			Capacity:     1 + rng.Int64N(50),
			RefillTokens: 1 + rng.Int64N(20),
			RefillPeriod: time.Duration(1+rng.Int64N(5_000_000)) * time.Microsecond,
		}
		if trial%4 == 3 {
			l = big[rng.IntN(len(big))]
		}
		var st State
		now, travel := t0, int64(0)
		taken := int64(0)
		for range perTrial {
			if rng.IntN(20) == 0 {
				now -= rng.Int64N(l.RefillPeriod.Microseconds()/4 + 1)
			} else {
				step := rng.Int64N(l.RefillPeriod.Microseconds()/(2*max(1, l.Capacity/50)) + 1)
				now, travel = now+step, travel+step
			}
			cost := 1 + rng.Int64N(min(l.Capacity, 1000))
			before := State{Last: st.Last, Bands: append([]Band(nil), st.Bands...)}
			d, ttl, write := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{l}, Cost: cost}, now)
			if d.Allowed {
				taken += cost
			} else if write || len(before.Bands) > 0 && len(st.Bands) > 0 && st.Bands[0] != before.Bands[0] {
				t.Fatalf("trial %d: a denial changed the bucket", trial)
			}
			if d.Remaining < 0 || d.Remaining > l.Capacity {
				t.Fatalf("trial %d: remaining %d outside 0..%d", trial, d.Remaining, l.Capacity)
			}
			if want := max(time.Millisecond, (d.ResetAfter + time.Millisecond - 1).Truncate(time.Millisecond)); ttl != want {
				t.Fatalf("trial %d: ttl %v, want %v", trial, ttl, want)
			}
			k := rateOf(l)
			bound := l.Capacity + travel*k.R/k.P
			if taken > bound {
				t.Fatalf("trial %d: took %d tokens, more than the %d the policy allows", trial, taken, bound)
			}
		}
	}
}
