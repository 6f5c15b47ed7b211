package tokenbucket

import (
	"flag"
	"fmt"
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
)

// TestSettleRules: each rule of Settle on one limit of 60 a minute (a token
// a second, capacity 60, a debt floor of 60).
func TestSettleRules(t *testing.T) {
	lim := ratelimit.PerMinute(60)
	p := int64(1_000_000) // 1/p of a token per unit: one token refills in p µs
	const now = int64(1_000_000_000)
	held := []Hold{{Limit: Lowest(lim), Tokens: 10}}
	for _, tc := range []struct {
		name           string
		level          int64 // before, in tokens (the bucket written at now)
		actual         int64
		held           []Hold
		wantLevel      int64 // after, in tokens
		wantWrite      bool
		allowed        bool
		retry, reset   time.Duration
		wantRemaining  int64
		missingAtStart bool
	}{
		{name: "unused tokens go back", level: 30, actual: 4, held: held, wantLevel: 36, wantWrite: true, allowed: true, reset: 24 * time.Second, wantRemaining: 36},
		{name: "a refund stops at full", level: 55, actual: 0, held: held, wantLevel: 60, wantWrite: true, allowed: true, wantRemaining: 60},
		{name: "a refund to a full bucket changes nothing", missingAtStart: true, actual: 0, held: held, wantLevel: 60, allowed: true, wantRemaining: 60},
		{name: "an overrun is charged", level: 30, actual: 25, held: held, wantLevel: 15, wantWrite: true, allowed: true, reset: 45 * time.Second, wantRemaining: 15},
		{name: "into debt", level: 5, actual: 20, held: held, wantLevel: -5, wantWrite: true, retry: 6 * time.Second, reset: 65 * time.Second},
		{name: "down to the floor, no further", level: 5, actual: 1 << 50, held: held, wantLevel: -60, wantWrite: true, retry: 61 * time.Second, reset: 120 * time.Second},
		{name: "the exact estimate changes nothing", level: 30, actual: 10, held: held, wantLevel: 30, allowed: true, reset: 30 * time.Second, wantRemaining: 30},
		{name: "a hold of another limit is left alone", level: 30, actual: 0, held: []Hold{{Limit: Lowest(ratelimit.PerMinute(61)), Tokens: 10}}, wantLevel: 30, allowed: true, reset: 30 * time.Second, wantRemaining: 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var st State
			if !tc.missingAtStart {
				st = State{Last: now, Bands: []Band{{Limit: Lowest(lim), Level: tc.level * p}}}
			}
			r := ratelimit.Request{Limits: []ratelimit.Limit{lim}}
			d, _, write := st.Settle(r, tc.held, []int64{tc.actual}, now)
			if write != tc.wantWrite {
				t.Fatalf("write = %v, want %v", write, tc.wantWrite)
			}
			if write && st.Bands[0].Level != tc.wantLevel*p {
				t.Fatalf("level = %d, want %d tokens", st.Bands[0].Level, tc.wantLevel)
			}
			if d.Allowed != tc.allowed || d.Remaining != tc.wantRemaining || d.RetryAfter != tc.retry || d.ResetAfter != tc.reset {
				t.Fatalf("decision %+v, want allowed %v remaining %d retry %v reset %v", d, tc.allowed, tc.wantRemaining, tc.retry, tc.reset)
			}
			// A check on the settled bucket sees the same standing.
			c, _, _ := st.Step(ratelimit.Request{Limits: r.Limits, Cost: 1}, now)
			if c.Allowed != tc.allowed || c.RetryAfter != tc.retry {
				t.Fatalf("the next check %+v, want allowed %v retry %v", c, tc.allowed, tc.retry)
			}
		})
	}
}

// TestDebtCarriesOverAPolicyChange: a bucket in debt keeps its debt, in
// whole tokens rounded down, when a new policy takes it over, and never goes
// below the new floor.
func TestDebtCarriesOverAPolicyChange(t *testing.T) {
	const now = int64(1_000_000_000)
	old := Lowest(ratelimit.PerMinute(60))
	st := State{Last: now, Bands: []Band{{Limit: old, Level: -5_500_000}}} // -5.5 tokens
	d, _, _ := st.Step(ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerMinute(120)}, Cost: 1}, now)
	if d.Allowed || !d.Converted || d.RetryAfter != 3250*time.Millisecond { // -5.5 tokens at 2 a second: 3.25 s to one
		t.Fatalf("converted check %+v; want denied, 3.25s", d)
	}
	st = State{Last: now, Bands: []Band{{Limit: old, Level: -50_000_000}}}
	d, _, _ = st.Step(ratelimit.Request{Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}, Cost: 1}, now)
	if d.RetryAfter != 80*time.Second { // -50 tokens floored at -3: 4 tokens at one per 20 s
		t.Fatalf("converted check %+v; want 80s (the new floor)", d)
	}
}

// settleModelSequences is how many random sequences of 80 steps
// TestReserveSettleModel runs; -settlemodel.sequences=2500 runs 200,000 steps.
var settleModelSequences = flag.Int("settlemodel.sequences", 300, "random sequences of TestReserveSettleModel")

// TestReserveSettleModel runs random checks, reserves and settles of a
// requests and a tokens limit through Step and Settle, beside a model in
// exact fractions written from the rules alone, and holds every decision to
// it. Reserves take up to the whole capacity of either limit; settles pick
// any open reservation, in any order, and use anything from nothing (a
// cancel) to an overrun deep into debt, so that refunds and cancels of other
// reservations land on a bucket in debt; time often stands still between
// steps, so that a debt is still there when they do. Over the whole run, for
// each limit, the tokens taken (checks, reserves, and charged overruns) minus
// the tokens refunded never exceed the capacity plus the rate times the time
// elapsed plus the debt floor, and a reservation settles once.
func TestReserveSettleModel(t *testing.T) {
	policies := [][]ratelimit.Limit{
		{ratelimit.PerMinute(20), ratelimit.NewLimit(1000, time.Minute, 3000)},
		{ratelimit.PerSecond(3), ratelimit.NewLimit(10, time.Second, 12)},
		{ratelimit.PerMinute(10), ratelimit.NewLimit(7, 3*time.Second, 5)},
	}
	rng := rand.New(rand.NewPCG(3, 5))
	// cost is a reserve's cost of limit l: often its whole capacity,
	// otherwise up to a third of it, so that several are often open.
	cost := func(l ratelimit.Limit) int64 {
		if rng.IntN(4) == 0 {
			return l.Capacity
		}
		return 1 + rng.Int64N(l.Capacity/3)
	}
	// used is what a settle of a hold of h tokens of l used: nothing (a
	// cancel), the estimate, less, a little more, or an overrun of up to
	// twice the capacity.
	used := func(l ratelimit.Limit, h int64) int64 {
		switch rng.IntN(5) {
		case 0:
			return 0
		case 1:
			return h
		case 2:
			return rng.Int64N(h + 1)
		case 3:
			return h + rng.Int64N(l.Capacity/4+1)
		}
		return h + rng.Int64N(2*l.Capacity+1)
	}
	for seq := range *settleModelSequences {
		var st State
		start := int64(1_700_000_000_000_000)
		now := start
		type res struct {
			holds []Hold
			costs []int64
		}
		var open []res
		limits := policies[seq%len(policies)]
		model := newModel(limits)
		// Each sequence has its own mix: reservations held a long time
		// (settles rare) or a short one, checks many or few.
		reserves := 2 + rng.IntN(4)
		settles := reserves + 1 + rng.IntN(4)
		for step := range 80 {
			switch rng.IntN(8) {
			case 0, 1, 2, 3:
			case 4:
				now += rng.Int64N(20_000_000)
			default:
				now += rng.Int64N(3_000_000)
			}
			model.refill(now)
			what := fmt.Sprintf("seq %d step %d", seq, step)
			switch x := rng.IntN(10); {
			case x < reserves: // reserve
				costs := []int64{cost(limits[0]), cost(limits[1])}
				r := ratelimit.Request{Limits: limits, Costs: costs}
				d, _, write := st.Step(r, now)
				if d.Allowed != model.fits(costs) || write != d.Allowed {
					t.Fatalf("%s: reserve %v = %+v, model fits %v", what, costs, d, model.fits(costs))
				}
				if d.Allowed {
					model.take(costs)
					open = append(open, res{Held(r, st.Last), costs})
				}
			case x < settles && len(open) > 0: // settle any one
				i := rng.IntN(len(open))
				rv := open[i]
				open = slices.Delete(open, i, i+1)
				actual := []int64{used(limits[0], rv.costs[0]), used(limits[1], rv.costs[1])}
				r := ratelimit.Request{Limits: limits}
				d, _, _ := st.Settle(r, rv.holds, actual, now)
				model.settle(rv.costs, actual)
				if d.Allowed != model.fits([]int64{1, 1}) || d.Remaining != model.remaining() {
					t.Fatalf("%s: settle %v of %v = %+v; model remaining %d", what, actual, rv.costs, d, model.remaining())
				}
			default: // a check of one request, one token
				r := ratelimit.Request{Limits: limits, Cost: 1}
				d, _, _ := st.Step(r, now)
				if d.Allowed != model.fits([]int64{1, 1}) {
					t.Fatalf("%s: check = %+v, model disagrees", what, d)
				}
				if d.Allowed {
					model.take([]int64{1, 1})
				}
			}
			model.checkBound(t, what, now-start)
			for i, b := range st.Bands {
				k := rateOf(b.Limit)
				if got, want := big.NewRat(k.Refill(b.Level, now-st.Last), k.P), model.level[i]; got.Cmp(want) != 0 {
					t.Fatalf("%s: band %d holds %v tokens, the model %v", what, i, got, want)
				}
			}
		}
	}
}

// TestRefundInDebt is the over-admission a refund of a whole capacity once
// made: on a bucket of 10 a minute, reserve 10 (A), after a token refills
// reserve 1 (B), settle B with an overrun that leaves the bucket at the
// floor, then cancel A. A's 10 tokens go back onto the debt: the bucket holds
// 0, not 10.
func TestRefundInDebt(t *testing.T) {
	lim := ratelimit.PerMinute(10)
	limits := []ratelimit.Limit{lim}
	now := int64(1_700_000_000_000_000)
	var st State
	a := ratelimit.Request{Limits: limits, Cost: 10}
	if d, _, _ := st.Step(a, now); !d.Allowed {
		t.Fatalf("reserve A = %+v", d)
	}
	now += 6_000_000 // one token
	b := ratelimit.Request{Limits: limits, Cost: 1}
	if d, _, _ := st.Step(b, now); !d.Allowed {
		t.Fatalf("reserve B = %+v", d)
	}
	if d, _, _ := st.Settle(ratelimit.Request{Limits: limits}, Held(b, st.Last), []int64{11}, now); d.Allowed {
		t.Fatalf("settle B with 11 used = %+v; want denied (10 in debt)", d)
	}
	if got := st.Bands[0].Level; got != -10*6_000_000 {
		t.Fatalf("after B's overrun the band holds %d, want -10 tokens", got)
	}
	d, _, _ := st.Settle(ratelimit.Request{Limits: limits}, Held(a, st.Last), []int64{0}, now)
	if d.Allowed || st.Bands[0].Level != 0 {
		t.Fatalf("cancel of A = %+v, band %d; want denied, 0 tokens", d, st.Bands[0].Level)
	}
}

// model is a bucket in exact fractions of a token, by the rules in words.
type model struct {
	limits          []ratelimit.Limit
	level           []*big.Rat // tokens
	taken, refunded []*big.Rat
	last            int64
}

func newModel(limits []ratelimit.Limit) *model {
	m := &model{limits: limits}
	for _, l := range limits {
		m.level = append(m.level, big.NewRat(l.Capacity, 1))
		m.taken = append(m.taken, new(big.Rat))
		m.refunded = append(m.refunded, new(big.Rat))
	}
	return m
}

func (m *model) refill(now int64) {
	for i, l := range m.limits {
		add := big.NewRat((now-m.last)*l.RefillTokens, l.RefillPeriod.Microseconds())
		if m.last == 0 {
			add = new(big.Rat)
		}
		m.level[i].Add(m.level[i], add)
		if c := big.NewRat(l.Capacity, 1); m.level[i].Cmp(c) > 0 {
			m.level[i] = c
		}
	}
	m.last = now
}

func (m *model) fits(costs []int64) bool {
	for i := range m.limits {
		if m.level[i].Cmp(big.NewRat(costs[i], 1)) < 0 {
			return false
		}
	}
	return true
}

func (m *model) take(costs []int64) {
	for i := range m.limits {
		c := big.NewRat(costs[i], 1)
		m.level[i].Sub(m.level[i], c)
		m.taken[i].Add(m.taken[i], c)
	}
}

// settle: the unused part back up to full, an overrun charged down to minus
// the capacity.
func (m *model) settle(held, actual []int64) {
	for i, l := range m.limits {
		before := new(big.Rat).Set(m.level[i])
		m.level[i].Add(m.level[i], big.NewRat(held[i]-actual[i], 1))
		if c := big.NewRat(l.Capacity, 1); m.level[i].Cmp(c) > 0 {
			m.level[i] = c
		}
		if f := big.NewRat(-l.Capacity, 1); m.level[i].Cmp(f) < 0 {
			m.level[i] = f
		}
		diff := new(big.Rat).Sub(m.level[i], before)
		if diff.Sign() > 0 {
			m.refunded[i].Add(m.refunded[i], diff)
		} else {
			m.taken[i].Sub(m.taken[i], diff)
		}
	}
}

func (m *model) remaining() int64 {
	least := int64(-1)
	for _, lv := range m.level {
		q := new(big.Int).Quo(lv.Num(), lv.Denom()).Int64() // toward zero
		if lv.Sign() < 0 {
			q = 0
		}
		if least < 0 || q < least {
			least = q
		}
	}
	return least
}

func (m *model) checkBound(t *testing.T, what string, elapsed int64) {
	t.Helper()
	for i, l := range m.limits {
		net := new(big.Rat).Sub(m.taken[i], m.refunded[i])
		bound := big.NewRat(2*l.Capacity, 1) // capacity + the debt floor
		bound.Add(bound, big.NewRat(elapsed*l.RefillTokens, l.RefillPeriod.Microseconds()))
		if net.Cmp(bound) > 0 {
			t.Fatalf("%s: limit %d took %v net of refunds, beyond %v", what, i, net, bound)
		}
	}
}
