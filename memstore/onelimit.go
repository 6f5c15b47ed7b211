package memstore

import (
	"math"
	"math/bits"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// lowest is a limit in lowest terms, the form State.Step counts in: a bucket
// of c tokens refilled r tokens every p µs, r and p with no common divisor,
// its level in units of 1/p of a token (see tokenbucket.Lowest).
type lowest struct{ c, r, p int64 }

func lowestOf(l ratelimit.Limit) lowest {
	k := tokenbucket.Lowest(l)
	return lowest{k.Capacity, k.RefillTokens, int64(k.RefillPeriod / time.Microsecond)}
}

// scalar is a bucket of one limit: found false for a missing one.
type scalar struct {
	found       bool
	last, level int64
}

// stepOne is tokenbucket's State.Step for the common case, on scalars: a
// request of the one limit l, k in lowest terms, on the bucket b, missing or
// written by a limit of the same rate and capacity (the same k). It sets *d
// to State.Step's Decision, b to the state State.Step leaves, and returns
// State.Step's ttl and write, the same for every such input
// (TestStepOneEqualsStep holds them equal), without the slices State.Step
// works on and with k worked out once per policy rather than on every
// check. State.Step's rules, for one limit and its own band:
//
//   - a clock behind last decides at last and adds the difference (back) to
//     RetryAfter and, when not zero, ResetAfter;
//   - the band refills by the time elapsed, capped at the capacity;
//   - a bucket then full is the same as a missing one, decided at now, and a
//     missing bucket is full;
//   - the request is allowed when the band holds cost tokens (one for a
//     peek), and then, unless peeking, cost is taken; only then is there
//     anything to write.
func stepOne(d *ratelimit.Decision, k lowest, l ratelimit.Limit, cost int64, peek bool, now int64, b *scalar) (ttl time.Duration, write bool) {
	full := k.c * k.p
	if peek {
		cost = 1
	}
	t0, back := now, int64(0)
	level := full
	if b.found {
		if b.last > now {
			t0, back = b.last, b.last-now
		}
		if missing := full - b.level; !refills(t0-b.last, k.r, missing) {
			level = b.level + (t0-b.last)*k.r // below full, so no overflow
		} else {
			t0, back = now, 0 // full: the same as missing
		}
	}

	need := cost * k.p
	var retry int64
	allowed := level >= need
	if allowed {
		if !peek {
			level -= need
		}
	} else {
		retry = ceilDiv(need-level, k.r) + back
	}
	reset := ceilDiv(full-level, k.r)
	if reset > 0 {
		reset += back
	}
	*d = ratelimit.Decision{
		Allowed:    allowed,
		Remaining:  max(level, 0) / k.p, // 0 in debt (see tokenbucket's Settle)
		RetryAfter: microsDuration(retry),
		ResetAfter: microsDuration(reset),
		Limit:      l,
	}
	write = allowed && !peek
	if write {
		*b = scalar{found: true, last: t0, level: level}
	}
	return tokenbucket.TTL(reset), write
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

// ceilDiv returns ⌈a/b⌉ for a >= 0 and b >= 1 (and 0 for a <= 0).
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1
}

// microsDuration converts µs to a Duration, saturating at the largest one,
// as State.Step does.
func microsDuration(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}
