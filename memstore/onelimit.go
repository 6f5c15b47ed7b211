package memstore

import (
	"math/bits"
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
		switch missing := b.Capacity*bp - level; {
		case last > now:
			t0, back = last, last-now
			level = carry(l, b, p, bp, level, 0)
		case refills(now-last, b.RefillTokens, missing):
			exists = false // full by now: the same as missing
		default:
			level = carry(l, b, p, bp, level, now-last)
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

// refills reports whether elapsed µs at tokens per µs refill missing:
// elapsed >= ⌈missing/tokens⌉, which is elapsed*tokens >= missing, compared
// without a division and without overflow.
func refills(elapsed, tokens, missing int64) bool {
	if missing <= 0 {
		return true
	}
	hi, lo := bits.Mul64(uint64(elapsed), uint64(tokens))
	return hi > 0 || lo >= uint64(missing)
}

// carry returns the level under l, of period p µs, of a band of limit b, of
// period bp µs, that is not full after elapsed µs: refilled when b is l, else
// its whole tokens, capped at l's capacity.
func carry(l, b ratelimit.Limit, p, bp, level, elapsed int64) int64 {
	if b == l {
		return level + elapsed*l.RefillTokens // below the capacity: not full
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
