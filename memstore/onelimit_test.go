package memstore

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

// randomLimit returns a valid limit, from one microsecond to an hour and from
// one token to the most the arithmetic allows.
func randomLimit(rng *rand.Rand) ratelimit.Limit {
	periods := []int64{1, 3, 1000, 999_983, 1_000_000, 60_000_000, 3_600_000_000}
	p := periods[rng.IntN(len(periods))]
	maxCap := int64(ratelimit.MaxExact) / p
	caps := []int64{1, 2, 7, 1000, 1 + rng.Int64N(min(maxCap, 1e6)), maxCap}
	c := min(caps[rng.IntN(len(caps))], maxCap)
	tokens := []int64{1, 3, c, 1 + rng.Int64N(1e6), ratelimit.MaxExact}
	return ratelimit.Limit{Capacity: c, RefillTokens: tokens[rng.IntN(len(tokens))], RefillPeriod: time.Duration(p) * time.Microsecond}
}

// TestStepOneEqualsStep holds the one-limit step on scalars equal to Step on
// random buckets, limits, policy changes, costs, peeks and clocks going back.
func TestStepOneEqualsStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base := int64(1_800_000_000_000_000)
	for i := range 300_000 {
		l := randomLimit(rng)
		b := l
		if rng.IntN(3) == 0 {
			b = randomLimit(rng)
		}
		bp := int64(b.RefillPeriod / time.Microsecond)
		full := b.Capacity * bp
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
		switch rng.IntN(6) {
		case 0: // at the edge of full again
			elapsed = max(0, ceilDiv(full-level, b.RefillTokens)+rng.Int64N(3)-1)
		case 1: // products of 2^64 and more
			elapsed = 4096 * (1 + rng.Int64N(1e6))
		case 2: // the clock went back
			elapsed = -rng.Int64N(1e7)
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

		st := ratelimit.State{}
		if found {
			st = ratelimit.State{Last: last, Bands: []ratelimit.Band{{Limit: b, Level: level}}}
		}
		wantD, wantTTL, wantWrite := st.Step(r, now)
		d, ttl, write, gotLast, gotLevel := stepOne(&r, now, found, b, last, level)
		if d != wantD || ttl != wantTTL || write != wantWrite {
			t.Fatalf("case %d: bucket %v (found %v, last %d, level %d), request %+v at %d:\nstepOne %+v %v %v\nStep    %+v %v %v",
				i, b, found, last, level, r, now, d, ttl, write, wantD, wantTTL, wantWrite)
		}
		if write && (gotLast != st.Last || len(st.Bands) != 1 || st.Bands[0] != (ratelimit.Band{Limit: l, Level: gotLevel})) {
			t.Fatalf("case %d: bucket %v (found %v, last %d, level %d), request %+v at %d: stepOne leaves last %d level %d, Step %+v",
				i, b, found, last, level, r, now, gotLast, gotLevel, st)
		}
	}
}
