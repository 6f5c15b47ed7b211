package ratelimit

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/exactlimit/ratelimit/internal/arith"
	"github.com/exactlimit/ratelimit/internal/units"
)

var (
	// ErrInvalidArgument is wrapped by every error that reports invalid
	// input: a policy, a cost, a subject, a time or a reservation token that
	// the limiter cannot decide on. Such errors are returned before any
	// store is called.
	ErrInvalidArgument = errors.New("ratelimit: invalid argument")

	// ErrNotReserved is wrapped by the error of a Settle or Cancel that
	// found no reservation to settle: it was settled or cancelled already
	// (by this process or another), or it expired and is kept as taken.
	// Nothing was refunded or charged.
	ErrNotReserved = errors.New("ratelimit: no such reservation")
)

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

// PerDay returns a Limit of n tokens per 24 hours, bursting to n.
func PerDay(n int64) Limit { return Limit{Capacity: n, RefillTokens: n, RefillPeriod: 24 * time.Hour} }

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
		strconv.FormatInt(l.RefillTokens, 10) + " per " + units.Format(l.RefillPeriod)
}

// Validate reports whether the limit can be enforced exactly. The error wraps
// ErrInvalidArgument and names the rule the limit broke:
//
//   - capacity must be at least 1
//   - refill tokens must be at least 1
//   - refill period must be at least 1µs, and a whole number of microseconds
//   - capacity, refill tokens and refill period in µs must each be at most 2^53
//   - capacity * refill period in lowest terms must be at most 2^53
//
// The last rule reads the rate in lowest terms: R tokens every P µs is the
// same rate as R/g tokens every P/g µs, where g is the greatest common divisor
// of R and P, and the bucket counts in units of g/P of a token. So any rate
// over a period of up to a day accepts a capacity of up to 104,249 (2^53
// divided by a day in µs), and round rates far more: a million a day is one
// token every 86,400 µs (capacity up to 10^11), ten million an hour one every
// 360 µs, a hundred thousand in 30 days one every 25.92 s; any rate per second
// accepts a capacity of up to 9·10^9.
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
	case l.Capacity > arith.MaxExact:
		return fmt.Sprintf("capacity must be at most 2^53 (got %d)", l.Capacity)
	case l.RefillTokens > arith.MaxExact:
		return fmt.Sprintf("refill tokens must be at most 2^53 (got %d)", l.RefillTokens)
	case l.periodMicros() > arith.MaxExact:
		return fmt.Sprintf("refill period in µs must be at most 2^53 (got %d)", l.periodMicros())
	}
	if k := l.rate(); k.C > arith.MaxExact/k.P {
		return fmt.Sprintf("capacity * refill period in lowest terms must be at most 2^53 (got %d * %d µs, the period of %d per %dµs in lowest terms)", k.C, k.P, l.RefillTokens, l.periodMicros())
	}
	return ""
}

// rate returns l in lowest terms. Two Limits of the same capacity and the
// same rate have the same rate value and are the same policy to a bucket.
func (l Limit) rate() arith.Rate {
	return arith.Lowest(l.Capacity, l.RefillTokens, l.periodMicros())
}

// Same reports whether l and m are the same policy: the same capacity, and the
// same refill rate once reduced to lowest terms (10 per second is 1 per 100
// ms). A bucket written by one is the bucket of the other, with no carry-over.
func (l Limit) Same(m Limit) bool { return l.rate() == m.rate() }

// policyChecked, when not nil, is called each time validatePolicy checks a
// policy: a test hook (see export_test.go), set before any test runs.
var policyChecked func()

// validatePolicy checks a policy of one or more limits and any quotas.
// With several, the error says which one broke a rule ("limit 1: ...",
// "quota 0: ...").
func validatePolicy(limits []Limit, quotas []Quota) error {
	if policyChecked != nil {
		policyChecked()
	}
	if len(limits) == 0 {
		return invalid("a policy needs at least one limit")
	}
	if n := len(limits) + len(quotas); n > arith.MaxLimits {
		if len(quotas) == 0 {
			return invalid("a policy may combine at most %d limits (got %d)", arith.MaxLimits, n)
		}
		return invalid("a policy may combine at most %d limits and quotas (got %d)", arith.MaxLimits, n)
	}
	for i, l := range limits {
		if rule := l.brokenRule(); rule != "" {
			if len(limits)+len(quotas) == 1 {
				return invalid("%s", rule)
			}
			return invalid("limit %d: %s", i, rule)
		}
	}
	for i, q := range quotas {
		if rule := q.brokenRule(); rule != "" {
			return invalid("quota %d: %s", i, rule)
		}
	}
	return nil
}

// policy is a Limiter's limits and quotas, which New validated. A Request
// that carries it (see Request.Validate) and whose Limits and Quotas equal
// them is not validated again. Its slices are copies of its own, which
// nothing hands out.
type policy struct {
	limits []Limit
	quotas []Quota
}

// holds reports whether limits and quotas are p's, validated by New. A nil
// p holds none.
func (p *policy) holds(limits []Limit, quotas []Quota) bool {
	return p != nil && slices.Equal(limits, p.limits) && slices.Equal(quotas, p.quotas)
}

// validateCosts checks a cost per limit and quota: each between 1 and its
// limit's capacity or its quota's allowance.
func validateCosts(limits []Limit, quotas []Quota, costs []int64) error {
	if len(costs) != len(limits)+len(quotas) {
		if len(quotas) == 0 {
			return invalid("costs must give one cost per limit (got %d for %d limits)", len(costs), len(limits))
		}
		return invalid("costs must give one cost per limit and quota (got %d for %d limits and %d quotas)", len(costs), len(limits), len(quotas))
	}
	for i, l := range limits {
		if c := costs[i]; c < 1 || c > l.Capacity {
			return invalid("limit %d's cost must be between 1 and its capacity %d (got %d)", i, l.Capacity, c)
		}
	}
	for i, q := range quotas {
		if c := costs[len(limits)+i]; c < 1 || c > q.Allowance {
			return invalid("quota %d's cost must be between 1 and its allowance %d (got %d)", i, q.Allowance, c)
		}
	}
	return nil
}

// validateCost checks that cost can ever be admitted by every limit and
// quota.
func validateCost(limits []Limit, quotas []Quota, cost int64) error {
	if cost < 1 {
		return invalid("cost must be at least 1 (got %d)", cost)
	}
	for _, l := range limits {
		if cost > l.Capacity {
			return invalid("cost must not exceed capacity (got %d > %d)", cost, l.Capacity)
		}
	}
	for i, q := range quotas {
		if cost > q.Allowance {
			return invalid("cost must not exceed quota %d's allowance (got %d > %d)", i, cost, q.Allowance)
		}
	}
	return nil
}

// periodMicros is the refill period in whole microseconds, as given (not in
// lowest terms).
func (l Limit) periodMicros() int64 { return int64(l.RefillPeriod / time.Microsecond) }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}
