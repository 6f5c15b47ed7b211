package tokenbucket

import (
	"math"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
)

// State is a bucket as a store keeps it between checks. The zero State is a
// missing bucket, which is full.
type State struct {
	// Last is the time, in microseconds since the Unix epoch, up to which
	// the bucket has been refilled.
	Last int64
	// Bands holds one entry per limit of the policy that last wrote the
	// bucket, in the policy's order.
	Bands []Band
}

// Band is one limit's part of a bucket.
type Band struct {
	// Limit is the limit that wrote this band.
	Limit ratelimit.Limit
	// Level is the band's content in units of 1/p of a token, where p is
	// the limit's refill period in µs in lowest terms (the period divided by
	// the greatest common divisor of the refill tokens and the period; see
	// Limit.Validate): Level/p whole tokens plus a remainder of Level%p. It
	// is between 0 and Capacity*p.
	Level int64
}

// Step is the token-bucket arithmetic, a pure function of the bucket's state,
// the request and the time now in microseconds since the Unix epoch: it
// updates *st and returns the Decision. Every store decides with it or with
// its twin, the Redis script, which gives the same result for every input.
// r must be valid (see Request.Validate); st must hold a state that Step
// produced.
//
// The rules, in order:
//
//   - A clock behind the bucket's Last credits nothing: the check is decided
//     at Last, and the difference is added to RetryAfter, ResetAfter and ttl.
//   - Each band is refilled by the time elapsed at the rate of the limit
//     that wrote it, exactly, capped at that limit's capacity.
//   - A bucket whose every band is then full is the same as a missing one,
//     and a missing bucket is full (decided at now, whatever its Last was).
//   - Each limit of the request takes the band its own policy wrote (the same
//     capacity and the same rate in lowest terms; see Limit.Same). A limit
//     that has none (the policy changed) takes over the first band left, in
//     order: the lesser of that band's whole tokens and its own capacity,
//     and below the capacity the part of a token the band held as well
//     (rounded down; see carry). With no band left it starts at the bucket's
//     fewest whole tokens, capped the same way. Every interval is so
//     credited once, at one policy's rate, and a change never mints; the
//     Decision then has Converted set.
//   - The request is allowed when every band holds cost tokens (for a peek,
//     one); then, unless peeking, cost is taken from every band.
//   - ResetAfter is the wait until every band is full: zero for a full
//     bucket, which needs no key (ttl is then the 1 ms minimum).
//
// ttl is how long the store should keep the new state: until the bucket would
// be full again, rounded up to the millisecond, and at least a millisecond.
// write reports whether st changed and must be stored: only when tokens were
// taken. A denial and a peek take nothing and change nothing, whichever
// policy wrote the bucket (the refill they saw is the same refill the next
// check sees).
func (st *State) Step(r ratelimit.Request, now int64) (d ratelimit.Decision, ttl time.Duration, write bool) {
	return st.step(r, now, true)
}

// StepAll decides several requests as one, all or nothing, each on its own
// bucket: sts[i] is the state of the bucket rs[i] is decided on, and each
// bucket must appear once. When every request is allowed, each state is
// stepped as Step would step it, ds and ttls get Step's decisions and ttls,
// and StepAll returns true. Otherwise no state changes and each decision is
// the one Step would give if nothing were taken: Allowed when its own bucket
// held its cost, with the untouched balance. The Redis script decides
// several keys the same way. ds and ttls must have len(rs) elements.
func StepAll(sts []*State, rs []ratelimit.Request, now int64, ds []ratelimit.Decision, ttls []time.Duration) bool {
	all := true
	for i, r := range rs {
		ds[i], ttls[i], _ = sts[i].step(r, now, false)
		all = all && ds[i].Allowed
	}
	if all {
		for i, r := range rs {
			ds[i], ttls[i], _ = sts[i].Step(r, now)
		}
	}
	return all
}

// step is Step; with take false it decides without taking or writing.
func (st *State) step(r ratelimit.Request, now int64, take bool) (d ratelimit.Decision, ttl time.Duration, write bool) {
	take = take && !r.Peek
	limits := r.Limits
	cost := r.Cost
	if r.Peek {
		cost = 1
	}
	var want [arith.MaxLimits]arith.Rate
	for i, l := range limits {
		want[i] = rateOf(l)
	}
	var have [arith.MaxLimits]arith.Rate
	var stored [arith.MaxLimits]int64 // the bands' levels, refilled
	t0, back := now, int64(0)
	exists := len(st.Bands) > 0
	if exists {
		if st.Last > now {
			t0, back = st.Last, st.Last-now
		}
		full := true
		for k, b := range st.Bands {
			have[k] = rateOf(b.Limit)
			stored[k] = have[k].Refill(b.Level, t0-st.Last)
			full = full && stored[k] == have[k].C*have[k].P
		}
		if full {
			exists, t0, back = false, now, 0
		}
	}

	var levels [arith.MaxLimits]int64
	if !exists {
		for i, k := range want[:len(limits)] {
			levels[i] = k.C * k.P
		}
	} else {
		m := len(st.Bands)
		fewest := int64(-1)
		for k := range m {
			fewest = minTokens(fewest, stored[k]/have[k].P)
		}
		// First each limit takes the band it wrote, then each limit left
		// takes the next band left: a changed limit carries over the band it
		// replaces, at no more than its own capacity. A limit with no band
		// left takes the bucket's fewest whole tokens.
		var used [arith.MaxLimits]bool
		var match [arith.MaxLimits]int
		matched := 0
		for i := range limits {
			match[i] = -1
			for k := range m {
				if !used[k] && have[k] == want[i] {
					match[i], used[k] = k, true
					matched++
					break
				}
			}
		}
		d.Converted = matched != len(limits) || matched != m
		next := 0
		for i, k := range want[:len(limits)] {
			if match[i] >= 0 {
				levels[i] = stored[match[i]]
				continue
			}
			tok := fewest
			for next < m && used[next] {
				next++
			}
			if next < m {
				// The band it replaces: its whole tokens, and the part of a
				// token it had, in this limit's units.
				used[next] = true
				hp := have[next].P
				if tok = stored[next] / hp; tok < k.C {
					levels[i] = tok*k.P + carry(stored[next]%hp, hp, k.P)
					continue
				}
			}
			levels[i] = min(tok, k.C) * k.P
		}
	}

	allowed := true
	for i, k := range want[:len(limits)] {
		if levels[i] < cost*k.P {
			allowed = false
			break
		}
	}
	var bound int
	var retry, reset int64
	d.Remaining = -1
	if allowed {
		for i, k := range want[:len(limits)] {
			if take {
				levels[i] -= cost * k.P
			}
			if tok := levels[i] / k.P; d.Remaining < 0 || tok < d.Remaining {
				d.Remaining, bound = tok, i
			}
		}
	} else {
		retry = -1
		for i, k := range want[:len(limits)] {
			d.Remaining = minTokens(d.Remaining, levels[i]/k.P)
			if need := cost * k.P; levels[i] < need {
				if w := arith.CeilDiv(need-levels[i], k.R); w > retry {
					retry, bound = w, i
				}
			}
		}
		retry += back
	}
	for i, k := range want[:len(limits)] {
		reset = max(reset, arith.CeilDiv(k.C*k.P-levels[i], k.R))
	}
	if reset > 0 {
		reset += back
	}

	d.Allowed = allowed
	d.RetryAfter = microsDuration(retry)
	d.ResetAfter = microsDuration(reset)
	d.Limit = limits[bound]

	write = take && allowed
	if write {
		if cap(st.Bands) < len(limits) {
			st.Bands = make([]Band, len(limits))
		}
		st.Bands = st.Bands[:len(limits)]
		for i, l := range limits {
			st.Bands[i] = Band{Limit: l, Level: levels[i]}
		}
		st.Last = t0
	}
	return d, TTL(reset), write
}

// carry converts the part of a token that a band of period p (in lowest
// terms) holds, rem/p, to units of 1/q: rem*q/p rounded down. When one
// period divides the other it is exact. Otherwise the product can pass 2^53,
// so the Redis script computes it in floating point, as floor(rem / p * q);
// carry computes the same value, with the same two IEEE roundings, and takes
// 2 units off, which makes up for them (their error is below 2 units), so the
// result never exceeds the exact one.
func carry(rem, p, q int64) int64 {
	switch {
	case p%q == 0:
		return rem / (p / q)
	case q%p == 0:
		return rem * (q / p)
	}
	return max(0, int64(math.Floor(float64(rem)/float64(p)*float64(q)))-2)
}

func minTokens(cur, tok int64) int64 {
	if cur < 0 || tok < cur {
		return tok
	}
	return cur
}
