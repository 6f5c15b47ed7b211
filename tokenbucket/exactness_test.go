package tokenbucket

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

func TestStepDailyQuotas(t *testing.T) {
	// A million a day is one token every 86,400 µs: exact, and accepted.
	day := ratelimit.PerDay(1_000_000)
	if err := day.Validate(); err != nil {
		t.Fatal(err)
	}
	runSteps(t, []ratelimit.Limit{day}, []op{
		{t: 0, cost: 1_000_000, allowed: true, remain: 0, reset: 24 * time.Hour},
		{t: 86_399, cost: 1, allowed: false, remain: 0, retry: time.Microsecond, reset: 24*time.Hour - 86_399*time.Microsecond},
		{t: 86_400, cost: 1, allowed: true, remain: 0, reset: 24 * time.Hour},
		// Half a day later, half the quota is back.
		{t: 86_400 + 12*3600*1_000_000, peek: true, allowed: true, remain: 500_000, reset: 12 * time.Hour},
	})
	// The largest policy of all: one token every 2^53 µs, whose waits
	// reach 2^53 µs and, behind a clock, pass it.
	huge := ratelimit.Limit{Capacity: 1, RefillTokens: 1, RefillPeriod: 1 << 53 * time.Microsecond}
	runSteps(t, []ratelimit.Limit{huge}, []op{
		{t: 1 << 40, cost: 1, allowed: true, remain: 0, reset: 1 << 53 * time.Microsecond},
		{t: 0, cost: 1, allowed: false, remain: 0, retry: (1<<53 + 1<<40) * time.Microsecond, reset: (1<<53 + 1<<40) * time.Microsecond},
	})
}

func TestStepSameRateInLowestTermsIsTheSamePolicy(t *testing.T) {
	tenPerSecond := ratelimit.PerSecond(10)
	onePer100ms := ratelimit.Limit{Capacity: 10, RefillTokens: 1, RefillPeriod: 100 * time.Millisecond}
	if !tenPerSecond.Same(onePer100ms) || tenPerSecond.Same(ratelimit.PerSecond(11)) || tenPerSecond.Same(ratelimit.NewLimit(10, time.Second, 20)) {
		t.Fatal("Same does not compare capacity and rate in lowest terms")
	}
	var st State
	d, _, _ := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{tenPerSecond}, Cost: 10}, t0)
	if !d.Allowed || d.Converted {
		t.Fatalf("first check = %+v", d)
	}
	// 150 ms later: 1.5 tokens under either form. The half token is kept,
	// so the next whole one comes 50 ms later, not 100.
	d, _, _ = st.Step(ratelimit.Request{Limits: []ratelimit.Limit{onePer100ms}, Cost: 1}, t0+150_000)
	if !d.Allowed || d.Remaining != 0 || d.Converted {
		t.Fatalf("the same rate in other terms = %+v, want allowed, 0 left, not converted", d)
	}
	d, _, _ = st.Step(ratelimit.Request{Limits: []ratelimit.Limit{tenPerSecond}, Cost: 1}, t0+199_999)
	if d.Allowed || d.RetryAfter != time.Microsecond || d.Converted {
		t.Fatalf("check at +199,999µs = %+v, want denied for 1µs more", d)
	}
}

func TestStepKeyLifetimeBehindARollbackIsRoundedOnce(t *testing.T) {
	// The bucket is full 938,617 µs after its Last, which is 500,001 µs
	// ahead of the clock: 1,438,618 µs, so 1,439 ms (not 939 + 501).
	runSteps(t, []ratelimit.Limit{ratelimit.PerSecond(10)}, []op{
		{t: 1_000_000, cost: 10, allowed: true, remain: 0, reset: time.Second},
		{t: 1_061_383, cost: 1, allowed: false, remain: 0, retry: 38_617 * time.Microsecond, reset: 938_617 * time.Microsecond},
		{t: 561_382, cost: 1, allowed: false, remain: 0, retry: 538_618 * time.Microsecond, reset: 1_438_618 * time.Microsecond},
	})
	var st State
	st.Step(ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 10}, t0+1_000_000)
	st.Step(ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 1}, t0+1_061_383)
	if _, ttl, _ := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerSecond(10)}, Cost: 1}, t0+561_382); ttl != 1439*time.Millisecond {
		t.Fatalf("ttl %v, want 1.439s", ttl)
	}
}

func TestStepFullBucketBehindTheClockWaitsForNothing(t *testing.T) {
	// A bucket of 100/s holding 50 tokens, met by a 10/s policy at a clock
	// 20 minutes behind its Last: carried over it is full (10 of 10).
	var st State
	big, small := []ratelimit.Limit{ratelimit.PerSecond(100)}, []ratelimit.Limit{ratelimit.PerSecond(10)}
	st.Step(ratelimit.Request{Limits: big, Cost: 50}, t0+20*60*1_000_000)
	d, ttl, _ := st.Step(ratelimit.Request{Limits: small, Peek: true}, t0)
	if !d.Allowed || d.Remaining != 10 || d.ResetAfter != 0 || ttl != time.Millisecond {
		t.Fatalf("peek = %+v ttl %v, want 10 left, ResetAfter 0, ttl 1ms", d, ttl)
	}
	// A take from it is no longer full: its wait counts from its Last.
	d, ttl, _ = st.Step(ratelimit.Request{Limits: small, Cost: 1}, t0)
	if !d.Allowed || d.Remaining != 9 || d.ResetAfter != 20*time.Minute+100*time.Millisecond || ttl != d.ResetAfter {
		t.Fatalf("take = %+v ttl %v, want 9 left, full 20m0.1s later", d, ttl)
	}
}

func TestStepPeekChangesNothing(t *testing.T) {
	perMin10, perMin5 := []ratelimit.Limit{ratelimit.PerMinute(10)}, []ratelimit.Limit{ratelimit.PerMinute(5)}
	var st State
	st.Step(ratelimit.Request{Limits: perMin10, Cost: 8}, t0)
	before := State{Last: st.Last, Bands: append([]Band(nil), st.Bands...)}
	// 12 s later 10/min has refilled 2 of the 8: 4 tokens. A 5/min peek
	// sees min(4, 5) = 4 and leaves the bucket as it was.
	d, _, write := st.Step(ratelimit.Request{Limits: perMin5, Peek: true}, t0+12_000_000)
	if !d.Allowed || d.Remaining != 4 || write || !d.Converted {
		t.Fatalf("peek by another policy = %+v write=%v, want 4 left, converted, nothing written", d, write)
	}
	if st.Last != before.Last || st.Bands[0] != before.Bands[0] {
		t.Fatalf("peek changed the bucket: %+v, was %+v", st, before)
	}
	d, _, _ = st.Step(ratelimit.Request{Limits: perMin10, Peek: true}, t0+12_000_000)
	if d.Remaining != 4 || d.Converted {
		t.Fatalf("the writer's own peek = %+v, want 4 left", d)
	}
}

func TestStepConvertedSaysWhenAnotherPolicyWroteTheBucket(t *testing.T) {
	a, b := ratelimit.PerSecond(10), ratelimit.PerSecond(20)
	tests := []struct {
		name      string
		first     []ratelimit.Limit
		then      []ratelimit.Limit
		converted bool
	}{
		{"the same policy", []ratelimit.Limit{a}, []ratelimit.Limit{a}, false},
		{"another policy", []ratelimit.Limit{a}, []ratelimit.Limit{b}, true},
		{"a limit added", []ratelimit.Limit{a}, []ratelimit.Limit{a, ratelimit.PerDay(1000)}, true},
		{"a limit removed", []ratelimit.Limit{a, ratelimit.PerDay(1000)}, []ratelimit.Limit{a}, true},
		{"the same limits in another order", []ratelimit.Limit{a, ratelimit.PerDay(1000)}, []ratelimit.Limit{ratelimit.PerDay(1000), a}, false},
	}
	for _, tt := range tests {
		var st State
		st.Step(ratelimit.Request{Limits: tt.first, Cost: 1}, t0)
		if d, _, _ := st.Step(ratelimit.Request{Limits: tt.then, Cost: 1}, t0+1); d.Converted != tt.converted {
			t.Errorf("%s: Converted = %v, want %v", tt.name, d.Converted, tt.converted)
		}
	}
}

// TestRollingDeployDoesNotStarve replays a rolling deploy from 10/s to 20/s:
// one subject at a random (Poisson) 8 requests a second for 600 s, each sent
// to an old or a new instance at random. Credited at the writer's rate, the
// mixed fleet denies no more than the old policy alone.
func TestRollingDeployDoesNotStarve(t *testing.T) {
	oldP, newP := []ratelimit.Limit{ratelimit.PerSecond(10)}, []ratelimit.Limit{ratelimit.PerSecond(20)}
	run := func(share float64, seed uint64) (denied, admitted int) {
		rng := rand.New(rand.NewPCG(seed, 1))
		var st State
		now := t0
		for now < t0+600_000_000 {
			now += int64(rng.ExpFloat64() / 8 * 1e6)
			p := oldP
			if rng.Float64() < share {
				p = newP
			}
			if d, _, _ := st.Step(ratelimit.Request{Limits: p, Cost: 1}, now); d.Allowed {
				admitted++
			} else {
				denied++
			}
		}
		return denied, admitted
	}
	for seed := uint64(1); seed <= 5; seed++ {
		oldDenied, _ := run(0, seed)
		newDenied, _ := run(1, seed)
		mixDenied, mixAdmitted := run(0.5, seed)
		if mixDenied > oldDenied {
			t.Errorf("seed %d: a 50/50 fleet denied %d, the old policy alone %d (new alone %d)", seed, mixDenied, oldDenied, newDenied)
		}
		// And the mix never admits more than the larger policy allows.
		if limit := 20 + 600*20; mixAdmitted > limit {
			t.Errorf("seed %d: admitted %d, more than %d", seed, mixAdmitted, limit)
		}
	}
}

// TestStepAlternatingPoliciesMintNothingOverTime alternates two policies on
// one bucket at random times and checks that the tokens taken never exceed
// the larger capacity plus the larger rate's refill of the time that passed.
func TestStepAlternatingPoliciesMintNothingOverTime(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	a, b := ratelimit.PerSecond(10), ratelimit.NewLimit(30, time.Second, 5)
	var st State
	now, taken := t0, int64(0)
	for i := range 200_000 {
		now += rng.Int64N(20_000)
		p := a
		if i%2 == 1 {
			p = b
		}
		if d, _, _ := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{p}, Cost: 1}, now); d.Allowed {
			taken++
		}
		if bound := int64(10) + (now-t0)*30/1_000_000; taken > bound {
			t.Fatalf("after %d checks took %d, more than %d", i, taken, bound)
		}
	}
}

func TestMicrosDurationSaturates(t *testing.T) {
	if got := microsDuration(1<<53 + 1<<52); got != math.MaxInt64 {
		t.Fatalf("microsDuration(2^53+2^52) = %v, want the largest Duration", got)
	}
	if got := microsDuration(1 << 53); got != (1<<53)*time.Microsecond {
		t.Fatalf("microsDuration(2^53) = %v", got)
	}
}
