package fallback

import (
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// shared returns r with each limit replaced by its fleet share, and each
// quota's allowance divided by the fleet (rounded down, at least 1).
func (s *Store) shared(r ratelimit.Request) ratelimit.Request {
	if s.share <= 1 {
		return r
	}
	limits := make([]ratelimit.Limit, len(r.Limits))
	for i, l := range r.Limits {
		limits[i] = Share(l, s.share)
	}
	r.Limits = limits
	if len(r.Quotas) > 0 {
		quotas := make([]ratelimit.Quota, len(r.Quotas))
		for i, q := range r.Quotas {
			quotas[i] = q
			quotas[i].Allowance = max(1, q.Allowance/s.share)
		}
		r.Quotas = quotas
	}
	return r
}

// beyondShare reports whether r costs more than lr, its shared form, can
// ever hold; then d denies it as an empty share would, taking nothing and
// asking the caller to wait for a full share.
func (s *Store) beyondShare(r, lr ratelimit.Request) (d ratelimit.Decision, denied bool, err error) {
	if s.share <= 1 || r.Peek {
		return d, false, nil
	}
	for i := range len(lr.Limits) + len(lr.Quotas) {
		cost := r.Cost
		if r.Costs != nil {
			cost = r.Costs[i]
		}
		most := int64(0)
		if i < len(lr.Limits) {
			most = lr.Limits[i].Capacity
		} else {
			most = lr.Quotas[i-len(lr.Limits)].Allowance
		}
		if cost > most {
			pr := lr
			pr.Peek = true
			if d, err = s.unchecked(pr, false); err != nil {
				return d, true, err
			}
			d.RetryAfter = d.ResetAfter
			d.Source = ratelimit.SourceLocal
			return d, true, nil
		}
	}
	return d, false, nil
}

// Share returns the limit each of n processes enforces during an outage so
// that together they stay near l: capacity and refill tokens divided by n,
// rounded down but at least 1, over the same refill period. Share(l, 1) is
// l. The result is valid whenever l is: when the divided rate needs, in
// lowest terms, a period too long for its capacity (a hundred million a day
// shared by 3 is 11,111,111 every 28.8·10^9 µs), it is the same rate as the
// refill tokens every n refill periods, exactly l's rate divided by n; and when n periods
// pass 2^53 µs, one token of capacity refilled once a period.
func Share(l ratelimit.Limit, n int64) ratelimit.Limit {
	if n <= 1 {
		return l
	}
	s := ratelimit.Limit{
		Capacity:     max(1, l.Capacity/n),
		RefillTokens: max(1, l.RefillTokens/n),
		RefillPeriod: l.RefillPeriod,
	}
	if s.Validate() == nil || l.Validate() != nil {
		return s
	}
	if p := l.RefillPeriod.Microseconds(); p <= tokenbucket.MaxExact/n {
		s.RefillTokens, s.RefillPeriod = l.RefillTokens, time.Duration(p*n)*time.Microsecond
		if s.Validate() == nil {
			return s
		}
	}
	return ratelimit.Limit{Capacity: 1, RefillTokens: 1, RefillPeriod: l.RefillPeriod}
}
