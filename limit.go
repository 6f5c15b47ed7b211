package ratelimit

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ErrInvalidArgument is wrapped by every error that reports invalid input: a
// policy, a cost, a subject or a time that the limiter cannot decide on. Such
// errors are returned before any store is called.
var ErrInvalidArgument = errors.New("ratelimit: invalid argument")

// ErrCorruptState is wrapped by the error a store returns when the bucket it
// holds for a key is malformed (a missing, non-numeric or out-of-range field).
// A malformed bucket never grants tokens.
var ErrCorruptState = errors.New("ratelimit: malformed bucket state")

// MaxExact is the bound every quantity of the bucket arithmetic stays within:
// capacity times refill period in microseconds, refill tokens, and times in
// microseconds since the Unix epoch. Sums of two such values stay below 2^53,
// the range in which Redis's Lua numbers (IEEE doubles) are exact integers.
const MaxExact = 1 << 52

// MaxLimits is the largest number of Limits one policy may combine.
const MaxLimits = 8

// Limit is a token-bucket policy: a bucket holds up to Capacity tokens and
// refills continuously at RefillTokens every RefillPeriod. Limit is a
// comparable value; two Limits are the same policy exactly when they are ==.
type Limit struct {
	// Capacity is the most tokens the bucket holds: the burst a subject
	// that has been idle may spend at once.
	Capacity int64
	// RefillTokens is how many tokens are added every RefillPeriod.
	RefillTokens int64
	// RefillPeriod is the period over which RefillTokens are added, a whole
	// number of microseconds. Refill is smooth: after a fraction of the
	// period, that fraction of RefillTokens has been added.
	RefillPeriod time.Duration
}

// PerSecond returns a Limit of n tokens per second, bursting to n.
func PerSecond(n int64) Limit { return Limit{Capacity: n, RefillTokens: n, RefillPeriod: time.Second} }

// PerMinute returns a Limit of n tokens per minute, bursting to n.
func PerMinute(n int64) Limit { return Limit{Capacity: n, RefillTokens: n, RefillPeriod: time.Minute} }

// PerHour returns a Limit of n tokens per hour, bursting to n.
func PerHour(n int64) Limit { return Limit{Capacity: n, RefillTokens: n, RefillPeriod: time.Hour} }

// NewLimit returns a Limit of permits tokens every per, bursting to burst.
// NewLimit(100, time.Second, 200) sustains 100 per second and lets an idle
// subject spend 200 at once. The result is not validated; call Validate, or
// let New do it.
func NewLimit(permits int64, per time.Duration, burst int64) Limit {
	return Limit{Capacity: burst, RefillTokens: permits, RefillPeriod: per}
}

// String describes the limit in words, naming each number: "capacity 200,
// refill 100 per 1s" for NewLimit(100, time.Second, 200), and "capacity 5,
// refill 5 per 1m" for PerMinute(5). The period is written as
// time.Duration writes it, without trailing zero units ("1m", not "1m0s").
func (l Limit) String() string {
	return "capacity " + strconv.FormatInt(l.Capacity, 10) + ", refill " +
		strconv.FormatInt(l.RefillTokens, 10) + " per " + shortDuration(l.RefillPeriod)
}

// shortDuration writes d as time.Duration does, with trailing zero minutes
// and seconds dropped: "1m", "1h", "1h30m", "90s" stays "1m30s".
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// Validate reports whether the limit can be enforced exactly. The error wraps
// ErrInvalidArgument and names the rule the limit broke:
//
//   - capacity must be at least 1
//   - refill tokens must be at least 1
//   - refill period must be at least 1µs, and a whole number of microseconds
//   - capacity * refill period in µs must be at most 2^52
//   - refill tokens must be at most 2^52
//
// The Redis script checks the same rules and reports them in the same words.
func (l Limit) Validate() error {
	if rule := l.brokenRule(); rule != "" {
		return invalid("%s", rule)
	}
	return nil
}

// brokenRule returns the first rule of Validate that l breaks, or "".
func (l Limit) brokenRule() string {
	switch {
	case l.Capacity < 1:
		return fmt.Sprintf("capacity must be at least 1 (got %d)", l.Capacity)
	case l.RefillTokens < 1:
		return fmt.Sprintf("refill tokens must be at least 1 (got %d)", l.RefillTokens)
	case l.RefillPeriod < time.Microsecond:
		return fmt.Sprintf("refill period must be at least 1µs (got %v)", l.RefillPeriod)
	case l.RefillPeriod%time.Microsecond != 0:
		return fmt.Sprintf("refill period must be a whole number of microseconds (got %v)", l.RefillPeriod)
	case l.Capacity > MaxExact/l.periodMicros():
		return fmt.Sprintf("capacity * refill period in µs must be at most 2^52 (got %d * %d)", l.Capacity, l.periodMicros())
	case l.RefillTokens > MaxExact:
		return fmt.Sprintf("refill tokens must be at most 2^52 (got %d)", l.RefillTokens)
	}
	return ""
}

// validateLimits checks a policy of one or more limits. With several, the
// error says which one broke a rule ("limit 1: ...").
func validateLimits(limits []Limit) error {
	if len(limits) == 0 {
		return invalid("a policy needs at least one limit")
	}
	if len(limits) > MaxLimits {
		return invalid("a policy may combine at most %d limits (got %d)", MaxLimits, len(limits))
	}
	for i, l := range limits {
		if rule := l.brokenRule(); rule != "" {
			if len(limits) == 1 {
				return invalid("%s", rule)
			}
			return invalid("limit %d: %s", i, rule)
		}
	}
	return nil
}

// validateCost checks that cost can ever be admitted by every limit.
func validateCost(limits []Limit, cost int64) error {
	if cost < 1 {
		return invalid("cost must be at least 1 (got %d)", cost)
	}
	for _, l := range limits {
		if cost > l.Capacity {
			return invalid("cost must not exceed capacity (got %d > %d)", cost, l.Capacity)
		}
	}
	return nil
}

// periodMicros is the refill period in whole microseconds.
func (l Limit) periodMicros() int64 { return int64(l.RefillPeriod / time.Microsecond) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
