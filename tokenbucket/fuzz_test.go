package tokenbucket

import (
	"math"
	"math/big"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

// FuzzStep holds Step to a big-integer oracle of its rules, for any policy
// the validation accepts (a request's and the one that wrote the bucket),
// any stored level, any clock (forward or behind the bucket), cost and peek:
// every Decision, ttl and stored state must agree, and no arithmetic may
// overflow or round. The seed corpus is in testdata/fuzz/FuzzStep.
func FuzzStep(f *testing.F) {
	f.Add(int64(10), int64(10), int64(1_000_000), int64(10), int64(10), int64(1_000_000), int64(5), int64(0), int64(100), int64(1), false, true)
	f.Add(int64(1_000_000), int64(1_000_000), int64(86_400_000_000), int64(10), int64(1), int64(100_000), int64(3), int64(1000), int64(5), int64(1), false, true)
	f.Add(int64(1), int64(1), int64(1<<53), int64(1<<53), int64(1<<53), int64(1), int64(0), int64(1<<40), int64(0), int64(1), true, true)
	f.Fuzz(func(t *testing.T, c, r, p, c2, r2, p2, level, last, now, cost int64, peek, exists bool) {
		l := ratelimit.Limit{Capacity: c, RefillTokens: r, RefillPeriod: time.Duration(p) * time.Microsecond}
		old := ratelimit.Limit{Capacity: c2, RefillTokens: r2, RefillPeriod: time.Duration(p2) * time.Microsecond}
		if p > math.MaxInt64/1000 || p2 > math.MaxInt64/1000 || l.Validate() != nil || old.Validate() != nil {
			return
		}
		if now < 0 || now > MaxTime || last < 0 || last > MaxTime {
			return
		}
		ko := rateOf(old)
		if level < 0 || level > ko.C*ko.P {
			return
		}
		r0 := ratelimit.Request{Limits: []ratelimit.Limit{l}, Cost: cost, Peek: peek}
		if r0.Validate() != nil {
			return
		}
		var st State
		if exists {
			st = State{Last: last, Bands: []Band{{Limit: old, Level: level}}}
		}
		want := oracle(st, l, cost, peek, now)
		d, ttl, write := st.Step(r0, now)
		if !reflect.DeepEqual(d, want.d) || ttl != want.ttl || write != want.write {
			t.Fatalf("Step = %+v ttl %v write %v; oracle %+v ttl %v write %v", d, ttl, write, want.d, want.ttl, want.write)
		}
		if write && (st.Last != want.last || st.Bands[0].Level != want.level) {
			t.Fatalf("Step stored last %d level %d; oracle %d %d", st.Last, st.Bands[0].Level, want.last, want.level)
		}
	})
}

type oracleResult struct {
	d           ratelimit.Decision
	ttl         time.Duration
	write       bool
	last, level int64
}

// oracle decides one check of one limit l on a bucket of at most one band,
// by Step's rules, in big integers.
func oracle(st State, l ratelimit.Limit, cost int64, peek bool, now int64) oracleResult {
	B := func(x int64) *big.Int { return big.NewInt(x) }
	lowest := func(l ratelimit.Limit) (c, r, p *big.Int) {
		g := new(big.Int).GCD(nil, nil, B(l.RefillTokens), B(l.RefillPeriod.Microseconds()))
		return B(l.Capacity), new(big.Int).Quo(B(l.RefillTokens), g), new(big.Int).Quo(B(l.RefillPeriod.Microseconds()), g)
	}
	ceil := func(a, b *big.Int) *big.Int {
		if a.Sign() <= 0 {
			return B(0)
		}
		q, m := new(big.Int).QuoRem(a, b, new(big.Int))
		if m.Sign() > 0 {
			q.Add(q, B(1))
		}
		return q
	}
	c, r, p := lowest(l)
	full := new(big.Int).Mul(c, p)
	need := B(cost)
	if peek {
		need = B(1)
	}
	t0, back := B(now), B(0)
	lv := new(big.Int).Set(full)
	converted := false
	if len(st.Bands) == 1 {
		b := st.Bands[0]
		oc, or, op := lowest(b.Limit)
		ofull := new(big.Int).Mul(oc, op)
		if st.Last > now {
			t0, back = B(st.Last), B(st.Last-now)
		}
		el := new(big.Int).Sub(t0, B(st.Last))
		stored := new(big.Int).Add(B(b.Level), new(big.Int).Mul(el, or))
		if stored.Cmp(ofull) > 0 {
			stored.Set(ofull)
		}
		if stored.Cmp(ofull) == 0 {
			t0, back = B(now), B(0) // full: a missing bucket
		} else if oc.Cmp(c) == 0 && or.Cmp(r) == 0 && op.Cmp(p) == 0 {
			lv = stored
		} else {
			converted = true
			tok, rem := new(big.Int).QuoRem(stored, op, new(big.Int))
			if tok.Cmp(c) >= 0 {
				lv = new(big.Int).Set(full)
			} else {
				// carry: exact when one period divides the other, else
				// Step's floating-point value, which must not exceed the
				// exact one.
				exact := new(big.Int).Quo(new(big.Int).Mul(rem, p), op)
				got := carry(rem.Int64(), op.Int64(), p.Int64())
				if big.NewInt(got).Cmp(exact) > 0 || new(big.Int).Sub(exact, B(got)).Cmp(B(3)) > 0 {
					panic("carry is off the exact value by more than it may be")
				}
				lv = new(big.Int).Add(new(big.Int).Mul(tok, p), B(got))
			}
		}
	}
	var res oracleResult
	needU := new(big.Int).Mul(need, p)
	allowed := lv.Cmp(needU) >= 0
	take := allowed && !peek
	if take {
		lv.Sub(lv, needU)
	}
	retry := B(0)
	if !allowed {
		retry = new(big.Int).Add(ceil(new(big.Int).Sub(needU, lv), r), back)
	}
	reset := ceil(new(big.Int).Sub(full, lv), r)
	if reset.Sign() > 0 {
		reset.Add(reset, back)
	}
	dur := func(us *big.Int) time.Duration {
		ns := new(big.Int).Mul(us, B(1000))
		if !ns.IsInt64() {
			return math.MaxInt64
		}
		return time.Duration(ns.Int64())
	}
	ms := ceil(reset, B(1000))
	if ms.Sign() == 0 {
		ms = B(1)
	}
	res.d = ratelimit.Decision{
		Allowed:    allowed,
		Remaining:  new(big.Int).Quo(lv, p).Int64(),
		RetryAfter: dur(retry),
		ResetAfter: dur(reset),
		Limit:      l,
		Converted:  converted,
	}
	res.ttl = dur(new(big.Int).Mul(ms, B(1000)))
	// A check writes what it took, and a bucket it converted, allowed or
	// denied; a peek writes nothing.
	res.write = take || converted && !peek
	res.last, res.level = t0.Int64(), lv.Int64()
	return res
}

// FuzzSettle holds Settle, and a check after it, to a big-integer oracle of
// their rules on one limit, for any policy the validation accepts, any level
// from the debt floor to full, any hold and any used count: the decision,
// the ttl, the stored level, and the next check's decision on a bucket in
// debt must agree, and no arithmetic may overflow or round.
func FuzzSettle(f *testing.F) {
	f.Add(int64(60), int64(1), int64(1_000_000), int64(30), int64(10), int64(25), int64(5_000_000), int64(1))
	f.Add(int64(60), int64(1), int64(1_000_000), int64(-50), int64(10), int64(1<<50), int64(0), int64(3))
	f.Add(int64(1<<30), int64(3), int64(7), int64(0), int64(1<<29), int64(0), int64(1), int64(1))
	// A cancel of a whole capacity on a band at its floor: the refund
	// lifts it to 0, not to full.
	f.Add(int64(10), int64(10), int64(60_000_000), int64(-10), int64(10), int64(0), int64(0), int64(1))
	f.Add(int64(10), int64(10), int64(60_000_000), int64(-3), int64(10), int64(2), int64(0), int64(1))
	f.Fuzz(func(t *testing.T, c, r, p, tokens, held, actual, elapsed, cost int64) {
		l := ratelimit.Limit{Capacity: c, RefillTokens: r, RefillPeriod: time.Duration(p) * time.Microsecond}
		if p > math.MaxInt64/1000 || l.Validate() != nil || elapsed < 0 || elapsed > 1<<40 {
			return
		}
		k := rateOf(l)
		debt := k.Debt()
		if tokens > c || tokens < -debt || held < 1 || held > c || actual < 0 || actual > MaxExact || cost < 1 || cost > c {
			return
		}
		const last = int64(1 << 50)
		now := last + elapsed
		B := func(x int64) *big.Int { return big.NewInt(x) }
		mul := func(a, b *big.Int) *big.Int { return new(big.Int).Mul(a, b) }
		ceil := func(a, b *big.Int) *big.Int {
			if a.Sign() <= 0 {
				return B(0)
			}
			q, m := new(big.Int).QuoRem(a, b, new(big.Int))
			if m.Sign() > 0 {
				q.Add(q, B(1))
			}
			return q
		}
		C, R, P := B(k.C), B(k.R), B(k.P)
		full, floor := mul(C, P), mul(B(-debt), P)
		// The bucket: tokens whole tokens at last, refilled to now.
		lv := new(big.Int).Add(mul(B(tokens), P), mul(B(elapsed), R))
		if lv.Cmp(full) > 0 {
			lv.Set(full)
		}
		before := new(big.Int).Set(lv)
		delta := B(actual - held)
		lv.Sub(lv, mul(delta, P))
		if lv.Cmp(full) > 0 {
			lv.Set(full)
		}
		if lv.Cmp(floor) < 0 {
			lv.Set(floor)
		}
		want := ratelimit.Decision{Allowed: lv.Cmp(P) >= 0, Limit: l}
		if q := new(big.Int).Div(lv, P); q.Sign() > 0 { // Div rounds toward -inf for P > 0
			want.Remaining = q.Int64()
		}
		if !want.Allowed {
			want.RetryAfter = time.Duration(ceil(new(big.Int).Sub(P, lv), R).Int64()) * time.Microsecond
		}
		reset := ceil(new(big.Int).Sub(full, lv), R)
		want.ResetAfter = time.Duration(reset.Int64()) * time.Microsecond
		ms := ceil(reset, B(1000))
		if ms.Sign() == 0 {
			ms = B(1)
		}
		wantTTL := time.Duration(ms.Int64()) * time.Millisecond

		st := State{Last: last, Bands: []Band{{Limit: Lowest(l), Level: tokens * k.P}}}
		rq := ratelimit.Request{Limits: []ratelimit.Limit{l}}
		d, ttl, write := st.Settle(rq, []Hold{{Limit: Lowest(l), Tokens: held}}, []int64{actual}, now)
		if !reflect.DeepEqual(d, want) || ttl != wantTTL || write != (lv.Cmp(before) != 0) {
			t.Fatalf("Settle = %+v ttl %v write %v; oracle %+v ttl %v write %v", d, ttl, write, want, wantTTL, lv.Cmp(before) != 0)
		}
		if write && (st.Bands[0].Level != lv.Int64() || st.Last != now) {
			t.Fatalf("Settle stored level %d at %d; oracle %v at %d", st.Bands[0].Level, st.Last, lv, now)
		}
		// The next check, at the same time, on what the settle left.
		if !write {
			return
		}
		need := mul(B(cost), P)
		next, _, _ := st.Step(ratelimit.Request{Limits: rq.Limits, Cost: cost}, now)
		if allowed := lv.Cmp(need) >= 0; next.Allowed != allowed {
			t.Fatalf("check of %d after the settle: %+v; oracle allowed %v (level %v)", cost, next, allowed, lv)
		} else if !allowed {
			if w := time.Duration(ceil(new(big.Int).Sub(need, lv), R).Int64()) * time.Microsecond; next.RetryAfter != w {
				t.Fatalf("check of %d after the settle: RetryAfter %v; oracle %v (level %v)", cost, next.RetryAfter, w, lv)
			}
		}
	})
}

// FuzzQuota holds the quota arithmetic to its rules on any state, request
// and time: a stored quota band of any window and count, a quota of any
// period and anchor hour, a check of any cost, a reservation settled with
// any count at any later time. It never panics; a check is allowed exactly
// when the bucket holds the cost and the window has it left, and then adds
// the cost to the window's count; a denial writes nothing; Standings give
// the allowance less the count; a settle in the reservation's window moves
// the count by the difference (never below zero), and in a later window
// changes nothing.
func FuzzQuota(f *testing.F) {
	f.Add(uint8(1), int64(30), int64(10), int64(5), int64(3), int64(0), int64(2), int64(1_000_000), uint8(9))
	f.Add(uint8(3), int64(5), int64(5), int64(0), int64(1), int64(86_400_000_000), int64(0), int64(0), uint8(23))
	f.Add(uint8(2), int64(1), int64(0), int64(1), int64(1), int64(-1), int64(40), int64(1<<40), uint8(0))
	f.Add(uint8(4), int64(1<<53), int64(1<<53), int64(1<<53), int64(1<<53), int64(1<<50), int64(1<<53), int64(1<<50), uint8(12))
	f.Fuzz(func(t *testing.T, period uint8, allowance, used, cost, reserved, shift, actual, later int64, hour uint8) {
		q := ratelimit.Quota{Allowance: allowance, Period: ratelimit.Period(period), Start: time.Date(2026, 1, 31, int(hour%24), 0, 0, 0, time.UTC)}
		if q.Validate() != nil || used < 0 || used > MaxExact || cost < 1 || cost > allowance || reserved < 1 || reserved > allowance ||
			actual < 0 || actual > MaxExact || later < 0 || later > 1<<45 || shift < -(1<<45) || shift > 1<<45 {
			return
		}
		const base = int64(1_800_000_000_000_000)
		now := base + shift
		lim := ratelimit.NewLimit(1<<40, time.Microsecond, 1<<40) // never binds
		s, e := q.Window(time.UnixMicro(now))
		st := State{Last: now, Bands: []Band{{Limit: Lowest(lim), Level: 1 << 40}},
			Quotas: []QuotaBand{{Start: s.UnixMicro(), End: e.UnixMicro(), Used: used}}}
		r := ratelimit.Request{Limits: []ratelimit.Limit{lim}, Quotas: []ratelimit.Quota{q}, Cost: cost}
		before := st
		before.Quotas = slices.Clone(st.Quotas)
		d, _, write := st.Step(r, now)
		fits := cost <= allowance-used
		if d.Allowed != fits || write != fits {
			t.Fatalf("check of %d with %d of %d used: %+v write %v", cost, used, allowance, d, write)
		}
		wantUsed := used
		if fits {
			wantUsed += cost
		} else if !reflect.DeepEqual(st, before) {
			t.Fatalf("a denial changed the state: %+v, was %+v", st, before)
		}
		if got := d.Standings[1]; got.Remaining != max(0, allowance-wantUsed) || got.ResetAfter != e.Sub(time.UnixMicro(now)) {
			t.Fatalf("standing %+v; want %d left, reset after %v", got, max(0, allowance-wantUsed), e.Sub(time.UnixMicro(now)))
		}
		if !fits && d.RetryAfter != e.Sub(time.UnixMicro(now)) {
			t.Fatalf("denied by the quota, retry after %v; the window ends in %v", d.RetryAfter, e.Sub(time.UnixMicro(now)))
		}
		// A reservation of reserved, settled later with actual.
		rr := r
		rr.Cost = reserved
		rd, _, _ := st.Step(rr, now)
		if !rd.Allowed {
			return
		}
		held := Held(rr, st.Last)
		usedNow := wantUsed + reserved
		at := now + later
		sd, _, _ := st.Settle(ratelimit.Request{Limits: r.Limits, Quotas: r.Quotas}, held, []int64{reserved, actual}, at)
		if at < e.UnixMicro() {
			want := min(max(0, usedNow+actual-reserved), MaxExact)
			if sd.Standings[1].Remaining != max(0, allowance-want) {
				t.Fatalf("settle of %d of %d in the window: %+v; want %d used", actual, reserved, sd, want)
			}
		} else if sd.Standings[1].Remaining != allowance {
			// A later window: a settle leaves it alone (nothing used
			// there, since the state was written in the earlier one).
			t.Fatalf("settle in a later window: %+v; want its whole %d", sd, allowance)
		}
	})
}
