package envoyrls

import (
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/ratelimitheader"
	"github.com/exactlimit/ratelimit/internal/units"
)

// reply is a response to one descriptor, the usual request, in one
// allocation: the message, its status and the status's reset.
type reply struct {
	resp     rlsv3.RateLimitResponse
	statuses [1]*rlsv3.RateLimitResponse_DescriptorStatus
	status   [1]rlsv3.RateLimitResponse_DescriptorStatus
	reset    [1]durationpb.Duration
}

// newResponse returns an OK response of n statuses, each OK, with the
// statuses to fill in and room for their resets (see setStatus).
func newResponse(n int) (*rlsv3.RateLimitResponse, []rlsv3.RateLimitResponse_DescriptorStatus, []durationpb.Duration) {
	var resp *rlsv3.RateLimitResponse
	var statuses []rlsv3.RateLimitResponse_DescriptorStatus
	var resets []durationpb.Duration
	if n == 1 {
		r := new(reply)
		resp, statuses, resets = &r.resp, r.status[:], r.reset[:]
		resp.Statuses = r.statuses[:]
	} else {
		resp = &rlsv3.RateLimitResponse{Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
		statuses, resets = make([]rlsv3.RateLimitResponse_DescriptorStatus, n), make([]durationpb.Duration, n)
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range statuses {
		statuses[i].Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &statuses[i]
	}
	return resp, statuses, resets
}

// setStatus fills in st, an OK status, as c's descriptor status, with its
// duration_until_reset in reset.
func setStatus(st *rlsv3.RateLimitResponse_DescriptorStatus, reset *durationpb.Duration, c *check) {
	r := c.rule
	switch {
	case r == nil || c.replaced:
		return
	case r.Unlimited: // never replaced (see ShouldRateLimit)
		st.LimitRemaining = maxUint32
		return
	case c.refund && c.bucket == nil: // rpu 0: nothing to give back
		return
	}
	b := c.bucket
	st.CurrentLimit, st.DurationUntilReset = c.current, reset
	until := max(b.d.ResetAfter, 0)
	if c.refund {
		st.LimitRemaining = uint32(min(max(b.d.Remaining, 0), maxUint32))
		setDuration(reset, until)
		return
	}
	if c.fits {
		st.LimitRemaining = uint32(min(c.seen-int64(c.hits), maxUint32))
	} else {
		// Over: nothing left for it, as the peer says, and never a reset
		// of 0 (a full bucket that can never hold the hits, or rpu 0,
		// resets in one unit).
		until = max(until, b.d.RetryAfter)
		if until <= 0 || b.limit == (ratelimit.Limit{}) {
			until = units.Durations[r.Unit]
		}
		if !b.shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	if b.limit == (ratelimit.Limit{}) {
		until = units.Durations[r.Unit] // rpu 0 never fills
	}
	setDuration(reset, until)
}

// setDuration sets p to d, as durationpb.New does.
func setDuration(p *durationpb.Duration, d time.Duration) {
	p.Seconds, p.Nanos = int64(d/time.Second), int32(d%time.Second)
}

var unitEnum = map[string]rlsv3.RateLimitResponse_RateLimit_Unit{
	"second": rlsv3.RateLimitResponse_RateLimit_SECOND,
	"minute": rlsv3.RateLimitResponse_RateLimit_MINUTE,
	"hour":   rlsv3.RateLimitResponse_RateLimit_HOUR,
	"day":    rlsv3.RateLimitResponse_RateLimit_DAY,
	"week":   rlsv3.RateLimitResponse_RateLimit_WEEK,
	"month":  rlsv3.RateLimitResponse_RateLimit_MONTH,
	"year":   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// responseHeaders are the headers of the binding check: the peer's three,
// then RateLimit-Policy and RateLimit (package ratelimitheader), and
// on a denial Retry-After, the whole seconds until the cost is there.
func (s *Service) responseHeaders(c *check, st *rlsv3.RateLimitResponse_DescriptorStatus) []*corev3.HeaderValue {
	reset := ratelimitheader.Seconds(st.DurationUntilReset.AsDuration())
	out := []*corev3.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(uint64(st.CurrentLimit.RequestsPerUnit), 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(reset, 10)},
	}
	b := c.bucket
	if b.limit == (ratelimit.Limit{}) {
		return out
	}
	name := c.rule.Name
	if name == "" {
		name = c.rule.Path
	}
	if f, ok := ratelimitheader.Of(name, b.limitsOf(), b.d); ok {
		out = append(out,
			&corev3.HeaderValue{Key: "RateLimit-Policy", Value: f.PolicyValue()},
			&corev3.HeaderValue{Key: "RateLimit", Value: f.Value()})
	}
	if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && b.d.RetryAfter > 0 {
		secs := ratelimitheader.RetryAfter(b.d.RetryAfter)
		out = append(out, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(secs, 10)})
	}
	return out
}
