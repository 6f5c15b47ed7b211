// Package ratelimitheader writes the rate-limit fields of a decision: the
// IETF httpapi draft's RateLimit-Policy and RateLimit, GitHub's
// X-RateLimit-Limit, -Remaining and -Reset, Retry-After, and OpenAI's
// x-ratelimit-*-requests and -tokens. The HTTP middleware (package
// httplimit), the gRPC interceptors (grpclimit), the ratelimit service's
// HTTP API (internal/server) and Envoy's rate limit service
// (internal/envoyrls) all write them through this package, so that their
// fields agree to the byte.
//
// Its input is numbers, not a ratelimit.Decision: Fields holds an entry per
// limit of the policy and the standing of the limit that bound the decision
// (Of builds it from a Decision and the limits it was made under), so that
// a decision that carries the standing of each of its limits can be written
// by filling in more of the same values.
package ratelimitheader

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// The names of the fields, as net/http canonicalizes them.
const (
	PolicyHeader     = "Ratelimit-Policy"
	RateLimitHeader  = "Ratelimit"
	LimitHeader      = "X-Ratelimit-Limit"
	RemainingHeader  = "X-Ratelimit-Remaining"
	ResetHeader      = "X-Ratelimit-Reset"
	RetryAfterHeader = "Retry-After"
)

// Policy is one item of RateLimit-Policy: a limit or a quota of the
// policy.
type Policy struct {
	// Name is the item's name, unquoted.
	Name string
	// Quota is the limit's capacity, or the quota's allowance (q).
	Quota int64
	// Window is the whole seconds, at least 1, an empty bucket of the
	// limit takes to fill, or the quota's current window lasts (w).
	Window int64
}

// Standing is where a limit stands after a decision.
type Standing struct {
	// Name is the item of RateLimit-Policy the standing is of, unquoted.
	Name string
	// Limit is the capacity Remaining reads against (X-RateLimit-Limit):
	// the limit's, or the share of it that decided (a fallback's).
	Limit int64
	// Remaining is the whole tokens left, 0 while in debt.
	Remaining int64
	// ResetAfter is the time until that limit's bucket is full.
	ResetAfter time.Duration
}

// Fields are the rate-limit fields of one decision: the policy's limits
// and the standing of the one that bound the decision.
type Fields struct {
	// Policy lists every limit of the policy, in order.
	Policy []Policy
	// Bound is the standing of the limit that bound the decision, which
	// RateLimit and X-RateLimit-* give.
	Bound Standing
}

// Of returns the fields of decision d, made under the policy limits named
// name: RateLimit-Policy lists every limit as "name";q=capacity;w=seconds,
// naming them name-1, name-2, ... when there are several; Bound is the
// limit d names (d.Limit), with its reset the time until that limit's
// bucket is full, and its capacity d.Limit's when d.Limit is not one of
// limits (a fallback's share). With no limits d.Limit is the policy. The
// result is false when limits is empty and d carries no valid limit:
// there is nothing to write.
func Of(name string, limits []ratelimit.Limit, d ratelimit.Decision) (Fields, bool) {
	return OfPolicy(name, limits, nil, d, time.Time{})
}

// OfPolicy is Of for a policy of limits and quotas, decided at now:
// RateLimit-Policy lists the limits and then the quotas, each quota as its
// allowance over its current window's length in seconds; when d carries
// the standing of each (Decision.Standings), Bound is the standing of the
// one d names (Decision.Binding), a quota's reset being its window's end.
func OfPolicy(name string, limits []ratelimit.Limit, quotas []ratelimit.Quota, d ratelimit.Decision, now time.Time) (Fields, bool) {
	if n := len(limits) + len(quotas); len(limits) > 0 && n > 1 && len(d.Standings) == n && d.Binding >= 0 && d.Binding < n {
		return ofStandings(name, limits, quotas, d, now), true
	}
	if len(limits) == 0 {
		if d.Limit.Validate() != nil {
			return Fields{}, false
		}
		limits = []ratelimit.Limit{d.Limit}
	}
	f := Fields{Policy: make([]Policy, len(limits))}
	bound, found := 0, false
	for i, l := range limits {
		f.Policy[i] = Policy{Name: itemName(name, i, len(limits)), Quota: max(l.Capacity, 0), Window: window(l)}
		if l == d.Limit && !found {
			bound, found = i, true
		}
	}
	remaining := max(d.Remaining, 0)
	resetAfter := max(d.ResetAfter, 0)
	if len(limits) > 1 && found {
		// d.ResetAfter is when every bucket is full; RateLimit names one
		// limit, so its t is when that limit's bucket is full.
		resetAfter = min(resetAfter, fullAfter(limits[bound], remaining))
	}
	capacity := limits[bound].Capacity
	if !found && d.Limit.Validate() == nil {
		// The decision was made under another limit than the policy's,
		// such as a fallback's share of it: its capacity is what
		// Remaining reads against.
		capacity = d.Limit.Capacity
	}
	f.Bound = Standing{Name: f.Policy[bound].Name, Limit: max(capacity, 0), Remaining: remaining, ResetAfter: resetAfter}
	return f, true
}

// QuotasOf returns the quotas of lim, a limiter, when it tells them (as
// *ratelimit.Limiter does, with its Quotas method); nil otherwise.
func QuotasOf(lim any) []ratelimit.Quota {
	if q, ok := lim.(interface{ Quotas() []ratelimit.Quota }); ok {
		return q.Quotas()
	}
	return nil
}

// ofStandings is OfPolicy from d's standing of each limit and quota.
func ofStandings(name string, limits []ratelimit.Limit, quotas []ratelimit.Quota, d ratelimit.Decision, now time.Time) Fields {
	n := len(limits) + len(quotas)
	f := Fields{Policy: make([]Policy, n)}
	for i := range n {
		f.Policy[i].Name = itemName(name, i, n)
		if i < len(limits) {
			f.Policy[i].Quota, f.Policy[i].Window = max(limits[i].Capacity, 0), window(limits[i])
			continue
		}
		q := quotas[i-len(limits)]
		start, end := q.Window(now)
		f.Policy[i].Quota, f.Policy[i].Window = q.Allowance, max(1, Seconds(end.Sub(start)))
	}
	b := d.Binding
	s := d.Standings[b]
	f.Bound = Standing{Name: f.Policy[b].Name, Limit: f.Policy[b].Quota, Remaining: max(s.Remaining, 0), ResetAfter: max(s.ResetAfter, 0)}
	if b < len(limits) && d.Limit.Validate() == nil && d.Limit != limits[b] {
		f.Bound.Limit = d.Limit.Capacity // a fallback's share of it
	}
	return f
}

// itemName is the name of limit i of n in a policy called name.
func itemName(name string, i, n int) string {
	if n == 1 {
		return name
	}
	return name + "-" + strconv.Itoa(i+1)
}

// PolicyValue returns RateLimit-Policy: each limit as
// "name";q=quota;w=window, separated by ", ".
func (f Fields) PolicyValue() string {
	var b strings.Builder
	for i, p := range f.Policy {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(sfString(p.Name))
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(p.Quota, 10))
		b.WriteString(";w=")
		b.WriteString(strconv.FormatInt(p.Window, 10))
	}
	return b.String()
}

// Value returns RateLimit: the bound limit as "name";r=remaining;t=seconds,
// with t the whole seconds, rounded up, until its bucket is full.
func (f Fields) Value() string {
	b := f.Bound
	return sfString(b.Name) + ";r=" + strconv.FormatInt(b.Remaining, 10) + ";t=" + strconv.FormatInt(Seconds(b.ResetAfter), 10)
}

// Each calls set with each field's name and value: RateLimit-Policy,
// RateLimit, and X-RateLimit-Limit, -Remaining and -Reset (the Unix time,
// in seconds rounded up, when the bound limit's bucket is full: now plus
// its ResetAfter). Retry-After is not among them: it belongs to denials,
// and RetryAfter gives it.
func (f Fields) Each(now time.Time, set func(name, value string)) {
	set(PolicyHeader, f.PolicyValue())
	set(RateLimitHeader, f.Value())
	set(LimitHeader, strconv.FormatInt(f.Bound.Limit, 10))
	set(RemainingHeader, strconv.FormatInt(f.Bound.Remaining, 10))
	set(ResetHeader, strconv.FormatInt(ceilUnix(now.Add(f.Bound.ResetAfter)), 10))
}

// Set sets the fields of Each on h.
func (f Fields) Set(h http.Header, now time.Time) { f.Each(now, h.Set) }

// Seconds returns d in whole seconds, rounded up; 0 for d <= 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfter returns Retry-After, in seconds, for a denial whose cost is
// there after wait: the whole seconds, rounded up, and at least 1.
func RetryAfter(wait time.Duration) int64 { return max(1, Seconds(wait)) }

// fullAfter returns the time a bucket of l holding remaining whole tokens
// takes to fill at most: the missing tokens' refill, rounded up.
func fullAfter(l ratelimit.Limit, remaining int64) time.Duration {
	if l.Validate() != nil {
		return 0
	}
	missing := max(l.Capacity-remaining, 0)
	// In lowest terms Validate bounds capacity * period in µs by 2^53: no
	// overflow.
	lo := tokenbucket.Lowest(l)
	us := (missing*lo.RefillPeriod.Microseconds() + lo.RefillTokens - 1) / lo.RefillTokens
	return time.Duration(us) * time.Microsecond
}

// window returns the whole seconds, rounded up and at least 1, an empty
// bucket of l takes to fill: capacity * period / refill tokens.
func window(l ratelimit.Limit) int64 {
	if l.Validate() != nil {
		return 1
	}
	// In lowest terms Validate bounds capacity * period in µs by 2^53: no
	// overflow.
	lo := tokenbucket.Lowest(l)
	us := lo.Capacity * lo.RefillPeriod.Microseconds()
	us = (us + lo.RefillTokens - 1) / lo.RefillTokens
	return max(1, (us+999_999)/1_000_000)
}

// ceilUnix returns t as Unix seconds, rounded up.
func ceilUnix(t time.Time) int64 {
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// sfString returns s as a structured-field string (RFC 8941): quoted, with
// '"' and '\' escaped, and any byte outside printable ASCII replaced by '?'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
