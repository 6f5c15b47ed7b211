package tokenbucket

import (
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
	"github.com/exactlimit/ratelimit/internal/calendar"
)

// Settle settles a reservation on the bucket at now, microseconds since the
// Unix epoch: held is what the reservation took (see Held), and actual the
// tokens the work really used from each of r's limits, in the order of
// r.Limits (r's costs are not used). The bucket is first brought up to date as
// Step would bring it, then each limit of r that held tokens gets its
// difference:
//
//   - Unused tokens go back, capped at the limit's capacity: a refund after
//     the bucket refilled never lifts it past full, and never gives back more
//     than was taken.
//   - An overrun is charged: the limit's band is lowered by it, below zero if
//     need be, into debt, but never below minus its capacity (minus less for
//     a limit whose capacity times its period in lowest terms is above 2^52:
//     the floor keeps twice that within 2^53). While a band is in debt every
//     check on it is denied, and RetryAfter counts the debt.
//   - A limit of r that the reservation did not take from (the policy
//     changed in between) is left as it is, and so is a held limit r no
//     longer has.
//   - A quota's difference goes to its window's used count, which a refund
//     never takes below zero and an overrun may take past the allowance
//     (denying the rest of the window), up to MaxExact; but only while the
//     window the reservation took from lasts: a settle after it ended
//     leaves the new window alone.
//
// The Decision is the standing afterwards, as a peek reports it: Allowed
// while every limit holds a token and every quota has one left. write
// reports whether st changed. r's limits and quotas must be valid,
// len(actual) == len(r.Limits)+len(r.Quotas), and each actual between 0
// and MaxExact.
func (st *State) Settle(r ratelimit.Request, held []Hold, actual []int64, now int64) (d ratelimit.Decision, ttl time.Duration, write bool) {
	var b bucket
	b.load(st, r.Limits, r.Quotas, now)
	d.Converted = b.converted
	limits := r.Limits
	var used [arith.MaxLimits]bool
	for i, k := range b.want[:len(limits)] {
		for j, h := range held {
			if used[j] || h.End != 0 || rateOf(h.Limit) != k {
				continue
			}
			used[j] = true
			if level := settled(k, b.levels[i], actual[i]-h.Tokens); level != b.levels[i] {
				b.levels[i], write = level, true
			}
			break
		}
	}
	for q := range r.Quotas {
		for j, h := range held {
			if used[j] || h.End == 0 || h.Start != b.windows[q][0] || h.End != b.windows[q][1] {
				continue
			}
			used[j] = true
			if u := min(max(0, b.used[q]+actual[len(limits)+q]-h.Tokens), MaxExact); u != b.used[q] {
				b.used[q], write = u, true
			}
			break
		}
	}
	var need [arith.MaxLimits]int64
	allowed := true
	for i := range len(limits) + len(r.Quotas) {
		if i < len(limits) {
			need[i] = b.want[i].P
			allowed = allowed && b.levels[i] >= need[i]
		} else {
			need[i] = 1
			allowed = allowed && b.quotaHolds(i-len(limits), 1)
		}
	}
	b.decide(&d, limits, r.Quotas, allowed, &need)
	if write {
		b.store(st, limits, r.Quotas)
	}
	return d, TTL(b.reset), write
}

// settled is a band of rate k at level after a settle's difference of delta
// tokens: an overrun (delta > 0) lowers it down to the debt floor, a refund
// (delta < 0) raises it up to full. No product passes 2^53.
func settled(k arith.Rate, level, delta int64) int64 {
	full, floor := k.C*k.P, -k.Debt()*k.P
	switch {
	case delta > 0:
		if delta >= k.C+k.Debt() || level-floor <= delta*k.P {
			return floor
		}
		return level - delta*k.P
	case delta < 0:
		// level is at least the floor, so a refund of capacity plus the
		// debt floor fills any band; below that the product stays within
		// 2^53. (A refund of the capacity alone does not: a band in debt
		// keeps its debt.)
		if -delta >= k.C+k.Debt() || full-level <= -delta*k.P {
			return full
		}
		return level - delta*k.P
	}
	return level
}

// Hold is what a reservation took from one limit or quota: Tokens from the
// band of Limit, in lowest terms; or, for a quota (End not zero), Tokens of
// the window from Start to End. A store keeps a reservation's holds until it
// is settled.
type Hold struct {
	Limit      ratelimit.Limit
	Start, End int64
	Tokens     int64
}

// Held returns the holds of a reservation that r took (Step allowed it) at
// the time at, µs since the Unix epoch: for each limit, in lowest terms, its
// cost; for each quota, its cost in its window at at. The time a Step that
// took tokens decided at is the state's Last after it.
func Held(r ratelimit.Request, at int64) []Hold {
	h := make([]Hold, len(r.Limits)+len(r.Quotas))
	for i := range h {
		if i < len(r.Limits) {
			h[i].Limit = Lowest(r.Limits[i])
		} else {
			q := r.Quotas[i-len(r.Limits)]
			h[i].Start, h[i].End = calendar.Window(uint8(q.Period), q.Start, at)
		}
		h[i].Tokens = r.Cost
		if r.Costs != nil {
			h[i].Tokens = r.Costs[i]
		}
	}
	return h
}
