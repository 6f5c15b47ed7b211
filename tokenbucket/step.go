package tokenbucket

import (
	"math"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/arith"
)

// State is a bucket as a store keeps it between checks. The zero State is a
// missing bucket, which is full.
type State struct {
	// Last is the time, in microseconds since the Unix epoch, up to which
	// the bucket has been refilled.
	Last int64
	// Bands holds one entry per limit of the policy that last wrote the
	// bucket, in the policy's order.
	Bands []Band
	// Quotas holds one entry per quota of the policy that last wrote the
	// bucket, in the policy's order: what was used in its window.
	Quotas []QuotaBand
}

// QuotaBand is one quota's part of a bucket: Used tokens of the window from
// Start to End (µs since the Unix epoch; Start <= t < End). A check in
// another window (a later one) finds nothing used. Used is at most MaxExact,
// and above the quota's allowance only after a settled overrun.
type QuotaBand struct {
	Start, End int64
	Used       int64
}

// Band is one limit's part of a bucket.
type Band struct {
	// Limit is the limit that wrote this band.
	Limit ratelimit.Limit
	// Level is the band's content in units of 1/p of a token, where p is
	// the limit's refill period in µs in lowest terms (the period divided by
	// the greatest common divisor of the refill tokens and the period; see
	// Limit.Validate): ⌊Level/p⌋ whole tokens plus a remainder. It is
	// between Capacity*p (full) and minus the debt floor times p (see
	// Settle); only a settled overrun takes it below zero.
	Level int64
}

// Step is the token-bucket arithmetic, a pure function of the bucket's state,
// the request and the time now in microseconds since the Unix epoch: it
// updates *st and returns the Decision. Every store decides with it or with
// its twin, the Redis script, which gives the same result for every input.
// r must be valid (see Request.Validate); st must hold a state that Step
// produced.
//
// The rules, in order:
//
//   - A clock behind the bucket's Last credits nothing: the check is decided
//     at Last, and the difference is added to RetryAfter, ResetAfter and ttl.
//   - Each band is refilled by the time elapsed at the rate of the limit
//     that wrote it, exactly, capped at that limit's capacity.
//   - A bucket whose every band is then full is the same as a missing one,
//     and a missing bucket is full (decided at now, whatever its Last was).
//   - Each limit of the request takes the band its own policy wrote (the same
//     capacity and the same rate in lowest terms; see Limit.Same). A limit
//     that has none (the policy changed) takes over the first band left, in
//     order: the lesser of that band's whole tokens and its own capacity,
//     and below the capacity the part of a token the band held as well
//     (rounded down; see carry). With no band left it starts at the bucket's
//     fewest whole tokens, capped the same way. Every interval is so
//     credited once, at one policy's rate, and a change never mints; the
//     Decision then has Converted set.
//   - Each quota of the request finds its window at the time decided at
//     (see ratelimit.Quota.Window) and takes the quota band of that window
//     (the first not taken, in order: quotas of one window match in order);
//     with none, nothing of the window is used. A quota band of any other
//     window is forgotten at the next write. A bucket whose bands are full
//     but whose quota bands have used something in their window is not
//     missing.
//   - The request is allowed when every band holds cost tokens (for a peek,
//     one) and every quota has them left in its window (used + cost <=
//     allowance); then, unless peeking, cost is taken from every band and
//     added to every quota's used.
//   - ResetAfter is the wait until every band is full and every quota that
//     used anything has reached its window's end: zero for a full bucket,
//     which needs no key (ttl is then the 1 ms minimum). A denial's
//     RetryAfter is the longest of the waits until each band holds its cost
//     and, for each quota short of it, until its window ends.
//
// ttl is how long the store should keep the new state: until the bucket would
// be full again, rounded up to the millisecond, and at least a millisecond.
// write reports whether st changed and must be stored: when tokens were
// taken, and when a check (not a peek) converted a bucket another policy
// wrote, allowed or denied, so that from then on it refills at the new
// policy's rate. Otherwise a denial and a peek take nothing and change
// nothing (the refill they saw is the same refill the next check sees).
func (st *State) Step(r ratelimit.Request, now int64) (d ratelimit.Decision, ttl time.Duration, write bool) {
	return st.step(r, now, true)
}

// StepAll decides several requests as one, all or nothing, each on its own
// bucket: sts[i] is the state of the bucket rs[i] is decided on, and each
// bucket must appear once. When every request is allowed, each state is
// stepped as Step would step it, ds and ttls get Step's decisions and ttls,
// and StepAll returns true. Otherwise no state changes and each decision is
// the one Step would give if nothing were taken: Allowed when its own bucket
// held its cost, with the untouched balance. The Redis script decides
// several keys the same way. ds and ttls must have len(rs) elements.
func StepAll(sts []*State, rs []ratelimit.Request, now int64, ds []ratelimit.Decision, ttls []time.Duration) bool {
	all := true
	for i, r := range rs {
		ds[i], ttls[i], _ = sts[i].step(r, now, false)
		all = all && ds[i].Allowed
	}
	if all {
		for i, r := range rs {
			ds[i], ttls[i], _ = sts[i].Step(r, now)
		}
	}
	return all
}

// step is Step; with take false it decides without taking or writing.
func (st *State) step(r ratelimit.Request, now int64, take bool) (d ratelimit.Decision, ttl time.Duration, write bool) {
	take = take && !r.Peek
	var b bucket
	b.load(st, r.Limits, r.Quotas, now)
	d.Converted = b.converted
	want := &b.want
	limits := r.Limits
	var need [arith.MaxLimits]int64 // what each limit asks for, in 1/P units, then each quota
	allowed := true
	for i := range len(limits) + len(r.Quotas) {
		c := int64(1)
		switch {
		case r.Peek:
		case r.Costs != nil:
			c = r.Costs[i]
		default:
			c = r.Cost
		}
		if i < len(limits) {
			need[i] = c * want[i].P
			allowed = allowed && b.levels[i] >= need[i]
		} else {
			need[i] = c
			allowed = allowed && b.quotaHolds(i-len(limits), c)
		}
	}
	if allowed && take {
		for i := range limits {
			b.levels[i] -= need[i]
		}
		for j := range r.Quotas {
			b.used[j] += need[len(limits)+j]
		}
	}
	b.decide(&d, limits, r.Quotas, allowed, &need)
	// A check under another policy writes the bucket it converted, even when
	// it is denied, so that the time from now on is credited at its own
	// policy's rate (the rate its RetryAfter counts at), not the old one's.
	write = take && (allowed || b.converted)
	if write {
		b.store(st, limits, r.Quotas)
	}
	return d, TTL(b.reset), write
}

// bucket is a State brought up to date for a policy: load's result, which
// step and Settle decide on.
type bucket struct {
	want      [arith.MaxLimits]arith.Rate // the policy's limits, in lowest terms
	levels    [arith.MaxLimits]int64      // each limit's level, refilled
	t0, back  int64                       // the time decided at, and the clock's catch-up
	converted bool                        // another policy wrote the bucket
	reset     int64                       // decide's ResetAfter, in µs
	quotas    []ratelimit.Quota           // the policy's quotas
	windows   [arith.MaxLimits][2]int64   // each quota's window at t0: start, end
	used      [arith.MaxLimits]int64      // what each quota's window used
}

// load brings st up to date at now for limits, by Step's rules: the clock
// behind Last, the refill of each band at its own rate, a full bucket like a
// missing one, and each limit taking its own band or carrying over another.
func (b *bucket) load(st *State, limits []ratelimit.Limit, quotas []ratelimit.Quota, now int64) {
	b.loadBands(st, limits, now)
	b.loadQuotas(st, quotas)
}

// loadBands is load's part for the limits: it sets t0 and back.
func (b *bucket) loadBands(st *State, limits []ratelimit.Limit, now int64) {
	want := &b.want
	for i, l := range limits {
		want[i] = rateOf(l)
	}
	var have [arith.MaxLimits]arith.Rate
	var stored [arith.MaxLimits]int64 // the bands' levels, refilled
	b.t0 = now
	exists := len(st.Bands) > 0
	if exists {
		if st.Last > now {
			b.t0, b.back = st.Last, st.Last-now
		}
		full := !quotaLive(st.Quotas, b.t0)
		for k, band := range st.Bands {
			have[k] = rateOf(band.Limit)
			stored[k] = have[k].Refill(band.Level, b.t0-st.Last)
			full = full && stored[k] == have[k].C*have[k].P
		}
		if full {
			exists, b.t0, b.back = false, now, 0
		}
	}
	if !exists {
		for i, k := range want[:len(limits)] {
			b.levels[i] = k.C * k.P
		}
		return
	}
	m := len(st.Bands)
	fewest, any := int64(0), false
	for k := range m {
		if tok := arith.FloorDiv(stored[k], have[k].P); !any || tok < fewest {
			fewest, any = tok, true
		}
	}
	// First each limit takes the band it wrote, then each limit left takes
	// the next band left: a changed limit carries over the band it
	// replaces, at no more than its own capacity and no deeper in debt than
	// its own floor. A limit with no band left takes the bucket's fewest
	// whole tokens.
	var used [arith.MaxLimits]bool
	var match [arith.MaxLimits]int
	matched := 0
	for i := range limits {
		match[i] = -1
		for k := range m {
			if !used[k] && have[k] == want[i] {
				match[i], used[k] = k, true
				matched++
				break
			}
		}
	}
	b.converted = matched != len(limits) || matched != m
	next := 0
	for i, k := range want[:len(limits)] {
		if match[i] >= 0 {
			b.levels[i] = stored[match[i]]
			continue
		}
		tok := fewest
		for next < m && used[next] {
			next++
		}
		if next < m {
			// The band it replaces: its whole tokens (rounded down, so a
			// debt is never forgiven), and the part of a token it had, in
			// this limit's units.
			used[next] = true
			hp := have[next].P
			if tok = arith.FloorDiv(stored[next], hp); tok < k.C && tok >= -k.Debt() {
				b.levels[i] = tok*k.P + carry(stored[next]-tok*hp, hp, k.P)
				continue
			}
		}
		b.levels[i] = min(max(tok, -k.Debt()), k.C) * k.P
	}
}

// decide fills in d from the levels and the quotas' counts: Allowed,
// Remaining (never below zero), RetryAfter until every limit holds need (in
// 1/P units) and every quota has its need left, ResetAfter, the binding limit
// or quota, and, for a policy of more than one, the Standings; it sets
// b.reset.
func (b *bucket) decide(d *ratelimit.Decision, limits []ratelimit.Limit, quotas []ratelimit.Quota, allowed bool, need *[arith.MaxLimits]int64) {
	var bound int
	var retry, reset int64
	n := len(limits) + len(quotas)
	if n > 1 {
		d.Standings = make([]ratelimit.Standing, n)
	}
	d.Remaining = -1
	for i := range n {
		var tok, wait, full int64 // tokens left, the wait until need is, until full
		short := false
		if i < len(limits) {
			k := b.want[i]
			tok = max(0, arith.FloorDiv(b.levels[i], k.P))
			if short = b.levels[i] < need[i]; short {
				wait = arith.CeilDiv(need[i]-b.levels[i], k.R)
			}
			full = arith.CeilDiv(k.C*k.P-b.levels[i], k.R)
		} else {
			j := i - len(limits)
			tok = max(0, quotas[j].Allowance-b.used[j])
			if short = !b.quotaHolds(j, need[i]); short {
				wait = b.windows[j][1] - b.t0
			}
			if b.used[j] > 0 {
				full = b.windows[j][1] - b.t0
			}
			if d.Standings != nil {
				d.Standings[i].ResetAfter = microsDuration(b.windows[j][1] - b.t0 + b.back)
			}
		}
		if d.Standings != nil {
			d.Standings[i].Remaining = tok
			if i < len(limits) && full > 0 {
				d.Standings[i].ResetAfter = microsDuration(full + b.back)
			}
		}
		if allowed {
			if d.Remaining < 0 || tok < d.Remaining {
				d.Remaining, bound = tok, i
			}
		} else {
			d.Remaining = minTokens(d.Remaining, tok)
			if short && wait > retry {
				retry, bound = wait, i
			}
		}
		reset = max(reset, full)
	}
	if !allowed {
		retry += b.back
	}
	if reset > 0 {
		reset += b.back
	}
	b.reset = reset
	d.Allowed = allowed
	d.RetryAfter = microsDuration(retry)
	d.ResetAfter = microsDuration(reset)
	d.Binding = bound
	if bound < len(limits) {
		d.Limit = limits[bound]
	}
}

// store writes the levels into st, as the bands of limits, refilled up to
// t0, and the quotas' counts, as the quota bands of their windows.
func (b *bucket) store(st *State, limits []ratelimit.Limit, quotas []ratelimit.Quota) {
	if cap(st.Bands) < len(limits) {
		st.Bands = make([]Band, len(limits))
	}
	st.Bands = st.Bands[:len(limits)]
	for i, l := range limits {
		st.Bands[i] = Band{Limit: l, Level: b.levels[i]}
	}
	st.Last = b.t0
	if len(quotas) == 0 {
		st.Quotas = st.Quotas[:0]
		return
	}
	if cap(st.Quotas) < len(quotas) {
		st.Quotas = make([]QuotaBand, len(quotas))
	}
	st.Quotas = st.Quotas[:len(quotas)]
	for j := range quotas {
		st.Quotas[j] = QuotaBand{Start: b.windows[j][0], End: b.windows[j][1], Used: b.used[j]}
	}
}

// carry converts the part of a token that a band of period p (in lowest
// terms) holds, rem/p, to units of 1/q: rem*q/p rounded down. When one
// period divides the other it is exact. Otherwise the product can pass 2^53,
// so the Redis script computes it in floating point, as floor(rem / p * q);
// carry computes the same value, with the same two IEEE roundings, and takes
// 2 units off, which makes up for them (their error is below 2 units), so the
// result never exceeds the exact one.
func carry(rem, p, q int64) int64 {
	switch {
	case p%q == 0:
		return rem / (p / q)
	case q%p == 0:
		return rem * (q / p)
	}
	return max(0, int64(math.Floor(float64(rem)/float64(p)*float64(q)))-2)
}

func minTokens(cur, tok int64) int64 {
	if cur < 0 || tok < cur {
		return tok
	}
	return cur
}
