package memstore

import (
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// randomLimit returns a valid limit: periods from a microsecond to 30 days,
// rates that do and do not reduce, and capacities from one token to the most
// the arithmetic allows.
func randomLimit(rng *rand.Rand) ratelimit.Limit {
	periods := []int64{1, 3, 1000, 999_983, 1_000_000, 60_000_000, 3_600_000_000, 86_400_000_000, 30 * 86_400_000_000}
	for {
		p := periods[rng.IntN(len(periods))]
		tokens := []int64{1, 3, 10, 1000, 1 + rng.Int64N(1e6), p, 2 * p, tokenbucket.MaxExact}
		l := ratelimit.Limit{RefillTokens: tokens[rng.IntN(len(tokens))], RefillPeriod: time.Duration(p) * time.Microsecond}
		low := tokenbucket.Lowest(l)
		maxCap := min(int64(tokenbucket.MaxExact), int64(tokenbucket.MaxExact)/int64(low.RefillPeriod/time.Microsecond))
		caps := []int64{1, 2, 7, 1000, 1 + rng.Int64N(min(maxCap, 1e6)), maxCap}
		l.Capacity = min(caps[rng.IntN(len(caps))], maxCap)
		if l.Validate() == nil {
			return l
		}
	}
}

// sameRate returns a limit of l's rate and capacity written differently
// (10 per second as 1 per 100 ms), or l itself when there is none at hand.
func sameRate(rng *rand.Rand, l ratelimit.Limit) ratelimit.Limit {
	if rng.IntN(2) == 0 {
		return l
	}
	low := tokenbucket.Lowest(l)
	if m := (ratelimit.Limit{Capacity: l.Capacity, RefillTokens: low.RefillTokens * 2, RefillPeriod: low.RefillPeriod * 2}); m.Validate() == nil {
		return m
	}
	return low
}

// TestStepOneEqualsStep holds the one-limit step on scalars equal to Step on
// random buckets of the request's own rate (written by the same limit or by
// one of the same rate in other terms), costs, peeks, clocks going back and
// times at the edge of the bucket's refilling.
func TestStepOneEqualsStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base := int64(1_800_000_000_000_000)
	for i := range 300_000 {
		l := randomLimit(rng)
		b := sameRate(rng, l)
		k := lowestOf(l)
		full := k.c * k.p
		var level int64
		switch rng.IntN(4) {
		case 0:
			level = 0
		case 1:
			level = full
		case 2:
			level = max(0, full-1-rng.Int64N(1000))
		default:
			level = rng.Int64N(full + 1)
		}
		now := base + rng.Int64N(1e9)
		var elapsed int64
		switch rng.IntN(7) {
		case 0: // at the edge of full again
			elapsed = max(0, ceilDiv(full-level, k.r)+rng.Int64N(3)-1)
		case 1: // products of 2^64 and more
			elapsed = 4096 * (1 + rng.Int64N(1e6))
		case 2: // the clock went back
			elapsed = -rng.Int64N(1e7)
		case 3: // far back: waits past the largest Duration
			elapsed = -(1e14 + rng.Int64N(2e15))
		default:
			elapsed = rng.Int64N(1e10)
		}
		last := now - elapsed
		found := rng.IntN(6) != 0
		r := ratelimit.Request{Limits: []ratelimit.Limit{l}, Peek: rng.IntN(4) == 0}
		if !r.Peek {
			r.Cost = 1 + rng.Int64N(min(l.Capacity, 1+rng.Int64N(20)))
			if rng.IntN(10) == 0 {
				r.Cost = l.Capacity
			}
		}

		st := tokenbucket.State{}
		if found {
			st = tokenbucket.State{Last: last, Bands: []tokenbucket.Band{{Limit: b, Level: level}}}
		}
		wantD, wantTTL, wantWrite := st.Step(r, now)
		var d ratelimit.Decision
		got := scalar{found: found, last: last, level: level}
		ttl, write := stepOne(&d, k, l, r.Cost, r.Peek, now, &got)
		gotLast, gotLevel := got.last, got.level
		if !reflect.DeepEqual(d, wantD) || ttl != wantTTL || write != wantWrite {
			t.Fatalf("case %d: bucket of %v (found %v, last %d, level %d), request %+v at %d:\nstepOne %+v %v %v\nStep    %+v %v %v",
				i, b, found, last, level, r, now, d, ttl, write, wantD, wantTTL, wantWrite)
		}
		if write && (gotLast != st.Last || len(st.Bands) != 1 || st.Bands[0] != (tokenbucket.Band{Limit: l, Level: gotLevel})) {
			t.Fatalf("case %d: bucket of %v (found %v, last %d, level %d), request %+v at %d: stepOne leaves last %d level %d, Step %+v",
				i, b, found, last, level, r, now, gotLast, gotLevel, st)
		}
	}
}
