// Package arith holds the integer arithmetic that the root package's
// validation and package tokenbucket's step share: the 2^53 bounds, rates in
// lowest terms, and the time unit.
package arith

import (
	"fmt"
	"time"
)

// MaxExact is the bound every quantity of the bucket arithmetic stays within,
// so that the Redis script's Lua numbers (IEEE doubles) hold it exactly.
const MaxExact = 1 << 53

// MaxTime is the latest time the arithmetic accepts, in microseconds since
// the Unix epoch: 2^52 µs, in the year 2112.
const MaxTime = 1 << 52

// MaxLimits is the largest number of limits one policy may combine.
const MaxLimits = 8

// Rate is a limit in lowest terms, the form the arithmetic works in: a bucket
// of C tokens refilled R tokens every P µs, where R and P have no common
// divisor. A bucket's level counts in units of 1/P of a token.
type Rate struct{ C, R, P int64 }

// Lowest returns the rate of capacity c refilled r tokens every p µs, in
// lowest terms. r and p must be at least 1.
func Lowest(c, r, p int64) Rate {
	g := Gcd(r, p)
	return Rate{c, r / g, p / g}
}

// Refill returns level after elapsed µs at k's rate, capped at capacity. It
// never forms a product above the capacity, so it stays exact.
func (k Rate) Refill(level, elapsed int64) int64 {
	full := k.C * k.P
	missing := full - level
	if missing <= 0 || elapsed >= CeilDiv(missing, k.R) {
		return full
	}
	return level + elapsed*k.R
}

// Debt returns the most tokens a band of rate k may owe: its capacity, or
// less when the capacity in 1/P units is above 2^52, so that a band's span
// from full to its floor, (C+Debt)·P, stays within MaxExact.
func (k Rate) Debt() int64 {
	return min(k.C, (MaxExact-k.C*k.P)/k.P)
}

// FloorDiv returns ⌊a/b⌋ for b >= 1, rounding down for a negative a too (Go's
// a / b rounds toward zero).
func FloorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// Gcd returns the greatest common divisor of a and b, both at least 1.
func Gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// CeilDiv returns ⌈a/b⌉ for a >= 0 and b >= 1 (and 0 for a <= 0).
func CeilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1
}

// Micros converts t to whole microseconds since the Unix epoch. For a time
// the arithmetic cannot take it returns the broken rule instead, in words:
// the zero time.Time (a programming error, an unset time), or a time before
// the epoch or after MaxTime.
func Micros(t time.Time) (us int64, rule string) {
	if t.IsZero() {
		return 0, "time is the zero time.Time: pass the time of the check, such as time.Now()"
	}
	us = t.UnixMicro()
	if us < 0 || us > MaxTime {
		return 0, fmt.Sprintf("time must be between the Unix epoch and 2^52 µs after it (got %v)", t)
	}
	return us, ""
}
