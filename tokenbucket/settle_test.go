package tokenbucket

import (
	"fmt"
	"math/big"
	"math/rand/v2"
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

// TestReserveSettleModel runs random checks, reserves and settles of a
// requests and a tokens limit through Step and Settle, beside a model in
// exact fractions written from the rules alone, and holds every decision to
// it. Over the whole run, for each limit, the tokens taken (checks,
// reserves, and charged overruns) minus the tokens refunded never exceed the
// capacity plus the rate times the time elapsed plus the debt floor, and a
// reservation settles once.
func TestReserveSettleModel(t *testing.T) {
	limits := []ratelimit.Limit{ratelimit.PerMinute(5), ratelimit.NewLimit(1000, time.Minute, 3000)}
	rng := rand.New(rand.NewPCG(3, 5))
	for seq := range 300 {
		var st State
		start := int64(1_700_000_000_000_000)
		now := start
		type res struct {
			holds []Hold
			costs []int64
		}
		open := map[int]res{}
		model := newModel(limits)
		for step := range 80 {
			now += rng.Int64N(3_000_000)
			model.refill(now)
			what := fmt.Sprintf("seq %d step %d", seq, step)
			switch x := rng.IntN(10); {
			case x < 5: // reserve
				costs := []int64{1, 1 + rng.Int64N(2000)}
				r := ratelimit.Request{Limits: limits, Costs: costs}
				d, _, write := st.Step(r, now)
				if d.Allowed != model.fits(costs) || write != d.Allowed {
					t.Fatalf("%s: reserve %v = %+v, model fits %v", what, costs, d, model.fits(costs))
				}
				if d.Allowed {
					model.take(costs)
					open[step] = res{Held(r), costs}
				}
			case x < 8 && len(open) > 0: // settle one
				var id int
				for id = range open {
					break
				}
				rv := open[id]
				delete(open, id)
				actual := []int64{rng.Int64N(2), rng.Int64N(4000)}
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
