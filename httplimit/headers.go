package httplimit

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// SetHeaders sets on h the rate-limit headers of decision d, made under the
// policy limits named name, at time now:
//
//   - RateLimit-Policy lists every limit as "name";q=capacity;w=seconds, where
//     w is the time an empty bucket takes to fill, rounded up. With several
//     limits they are named name-1, name-2, ...
//   - RateLimit gives the limit that bound d as "name";r=remaining;t=seconds,
//     with t the seconds until that limit's bucket is full, rounded up: with
//     several limits, r and t both belong to the limit the field names.
//   - X-RateLimit-Limit is that limit's capacity (d.Limit's when it is not one
//     of limits, as a fallback's share), X-RateLimit-Remaining the
//     tokens left, and X-RateLimit-Reset the Unix time, in seconds rounded
//     up, when that bucket is full.
//
// Retry-After is not set here: it belongs to denials only, and the middleware
// adds it. SetHeaders sets nothing when limits is empty and d carries no
// valid limit. The middleware and the ratelimit service both use it, so their
// headers agree.
func SetHeaders(h http.Header, name string, limits []ratelimit.Limit, d ratelimit.Decision, now time.Time) {
	if len(limits) == 0 {
		if d.Limit.Validate() != nil {
			return
		}
		limits = []ratelimit.Limit{d.Limit}
	}
	quoted := sfString(name)
	names := func(i int) string {
		if len(limits) == 1 {
			return quoted
		}
		return sfString(name + "-" + strconv.Itoa(i+1))
	}
	var policy strings.Builder
	bound, found := 0, false
	for i, l := range limits {
		if i > 0 {
			policy.WriteString(", ")
		}
		policy.WriteString(names(i))
		policy.WriteString(";q=")
		policy.WriteString(strconv.FormatInt(max(l.Capacity, 0), 10))
		policy.WriteString(";w=")
		policy.WriteString(strconv.FormatInt(window(l), 10))
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
	reset := ceilSeconds(resetAfter)
	h.Set("RateLimit-Policy", policy.String())
	h.Set("RateLimit", names(bound)+";r="+strconv.FormatInt(remaining, 10)+";t="+strconv.FormatInt(reset, 10))
	capacity := limits[bound].Capacity
	if !found && d.Limit.Validate() == nil {
		// The decision was made under another limit than the policy's,
		// such as a fallback's share of it: its capacity is what
		// Remaining reads against.
		capacity = d.Limit.Capacity
	}
	h.Set("X-RateLimit-Limit", strconv.FormatInt(max(capacity, 0), 10))
	h.Set("X-RateLimit-Remaining", strconv.FormatInt(remaining, 10))
	h.Set("X-RateLimit-Reset", strconv.FormatInt(ceilUnix(now.Add(resetAfter)), 10))
}

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

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
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
