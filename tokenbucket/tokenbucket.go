// Package tokenbucket is the token-bucket arithmetic every store of package
// ratelimit decides with, for store authors, and Bucket, a token bucket kept
// in this process for single-process use.
//
// The arithmetic is integer and exact. Time is whole microseconds since the
// Unix epoch (see Micros); a bucket counts its tokens in units of 1/p of a
// token, where p is its limit's refill period in lowest terms, so refill is
// smooth and loses nothing to rounding. Every quantity stays within MaxExact
// (2^53), so the Redis script, whose Lua numbers are doubles, computes the
// same values; ratelimit.Limit.Validate refuses a policy that could leave it.
//
// State.Step is a pure function of a bucket's state, a request and the time:
// it does no I/O and reads no clock. memstore, Bucket and package fallback's
// local buckets call it; package redisstore runs its twin in Redis, and a
// differential test holds the two equal on random inputs.
package tokenbucket

import (
	"errors"
	"math"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
)

// MaxExact is the bound every quantity of the arithmetic stays within: 2^53,
// the largest integer below which every integer is an IEEE double.
const MaxExact = 1 << 53

// MaxTime is the latest time the arithmetic accepts, in microseconds since
// the Unix epoch: 2^52 µs, in the year 2112.
const MaxTime = 1 << 52

// ErrCorruptState is wrapped by the error a store returns when the bucket it
// read is not one a store wrote (a key overwritten by something else, say).
// A malformed bucket never grants tokens.
var ErrCorruptState = errors.New("ratelimit: malformed bucket state")

// Micros converts t to whole microseconds since the Unix epoch, the time unit
// of the arithmetic. It fails, wrapping ratelimit.ErrInvalidArgument, for a
// time before the epoch or after MaxTime; for the zero time.Time the error
// says that it is the zero time, a programming error (an unset time).
func Micros(t time.Time) (int64, error) {
	us, rule := arith.Micros(t)
	if rule != "" {
		return 0, invalid("%s", rule)
	}
	return us, nil
}

// TTL returns how long a store keeps a bucket whose ResetAfter is reset µs:
// reset rounded up to the millisecond, and at least a millisecond.
func TTL(reset int64) time.Duration {
	return microsDuration(max(1, arith.CeilDiv(reset, 1000)) * 1000)
}

// Lowest returns l in lowest terms: the same capacity, and RefillTokens and
// RefillPeriod (in µs) divided by their greatest common divisor. PerSecond(10)
// in lowest terms is 10 tokens, refilled 1 every 100 ms. l must be valid.
// A store that keeps the policy beside the bucket keeps it in lowest terms,
// so that the same policy written two ways is one policy (see
// ratelimit.Limit.Same).
func Lowest(l ratelimit.Limit) ratelimit.Limit {
	k := rateOf(l)
	return ratelimit.Limit{Capacity: k.C, RefillTokens: k.R, RefillPeriod: time.Duration(k.P) * time.Microsecond}
}

// rateOf returns l in lowest terms, as the arithmetic uses it.
func rateOf(l ratelimit.Limit) arith.Rate {
	return arith.Lowest(l.Capacity, l.RefillTokens, int64(l.RefillPeriod/time.Microsecond))
}

// microsDuration converts µs to a Duration, saturating at the largest one
// (waits of more than 292 years).
func microsDuration(us int64) time.Duration {
	if us > math.MaxInt64/int64(time.Microsecond) {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// MaxLimits is the largest number of limits one policy may combine.
const MaxLimits = 8
