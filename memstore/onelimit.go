package memstore

import (
	"time"

	"github.com/exactlimit/ratelimit"
)

// stepOne is ratelimit's Step for the common case, on scalars: a request of
// one limit l on a bucket that is missing (found false) or was written by a
// policy of one limit, b, with Last last and level level. It returns what
// Step returns and the bucket's new Last and level, the same for every input
// (TestStepOneEqualsStep holds them equal), without the slices Step works
// on. Step's rules, for one limit and one band:
//
//   - a bucket full by now under b is missing, and a missing bucket is full;
//   - a clock behind last decides at last and adds the difference (back) to
//     RetryAfter, ResetAfter and ttl;
//   - a band of l itself refills by the time elapsed; a band of another limit
//     hands its whole tokens over to l, capped at l's capacity, with no
//     refill for the time before the change;
//   - the request is allowed when the band holds cost tokens (one for a
//     peek), and then, unless peeking, cost is taken.
func stepOne(r *ratelimit.Request, now int64, found bool, b ratelimit.Limit, last, level int64) (d ratelimit.Decision, ttl time.Duration, write bool, newLast, newLevel int64) {
	l := r.Limits[0]
	p := micros(l.RefillPeriod)
	full := l.Capacity * p
	cost := r.Cost
	if r.Peek {
		cost = 1
	}
	t0, back := now, int64(0)
	exists := found
	if exists {
		bp := micros(b.RefillPeriod)
		missing := b.Capacity*bp - level
		if last > now {
			t0, back = last, last-now
			level = carry(l, b, p, bp, full, level, missing, 0)
		} else if elapsed := now - last; elapsed >= ceilDiv(missing, b.RefillTokens) {
			exists = false // full by now: the same as missing
		} else {
			level = carry(l, b, p, bp, full, level, missing, elapsed)
		}
	}
	if !exists {
		level = full
	}

	need := cost * p
	var retry int64
	d.Allowed = level >= need
	if d.Allowed {
		if !r.Peek {
			level -= need
		}
	} else {
		retry = ceilDiv(need-level, l.RefillTokens) + back
	}
	d.Remaining = level / p
	reset := ceilDiv(full-level, l.RefillTokens)
	ttlMillis := max(1, ceilDiv(reset, 1000)+ceilDiv(back, 1000))
	reset += back
	d.RetryAfter = time.Duration(retry) * time.Microsecond
	d.ResetAfter = time.Duration(reset) * time.Microsecond
	d.Limit = l

	return d, time.Duration(ttlMillis) * time.Millisecond, exists || !r.Peek, t0, level
}

// carry returns the level under l of a band of limit b (period bp µs,
// missing that much of being full) after elapsed µs: refilled when b is l,
// else its whole tokens, capped at l's capacity.
func carry(l, b ratelimit.Limit, p, bp, full, level, missing, elapsed int64) int64 {
	if b == l {
		if missing <= 0 || elapsed >= ceilDiv(missing, l.RefillTokens) {
			return full
		}
		return level + elapsed*l.RefillTokens
	}
	return min(level/bp, l.Capacity) * p
}

// micros is a refill period in whole microseconds.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// ceilDiv returns ⌈a/b⌉ for a >= 0 and b >= 1 (and 0 for a <= 0).
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a + b - 1) / b
}
