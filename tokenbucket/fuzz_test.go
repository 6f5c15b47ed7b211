package tokenbucket

import (
	"github.com/exactlimit/ratelimit"
	"math"
	"math/big"
	"testing"
	"time"
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
		if d != want.d || ttl != want.ttl || write != want.write {
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
	res.write = take
	res.last, res.level = t0.Int64(), lv.Int64()
	return res
}
