package ratelimit_test

import (
	"context"
	"flag"
	"fmt"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/testkit"
	"github.com/exactlimit/ratelimit/memstore"
)

var planModelSeed = flag.Uint64("plan-model-seed", 0, "the seed of TestPlansModel (0: a few fixed seeds)")

// modelBand is a subject's bucket in the model: the policy that wrote it,
// its tokens (a fraction) and the time of that write, in µs.
type modelBand struct {
	limit  ratelimit.Limit
	tokens *big.Rat
	last   int64
}

// modelRate is a limit's rate in lowest terms: r tokens every p µs.
func modelRate(l ratelimit.Limit) (c, r, p int64) {
	r, p = l.RefillTokens, l.RefillPeriod.Microseconds()
	g := new(big.Int).GCD(nil, nil, big.NewInt(r), big.NewInt(p)).Int64()
	return l.Capacity, r / g, p / g
}

func ratOf(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

func floorRat(x *big.Rat) int64 {
	q := new(big.Int).Div(x.Num(), x.Denom()) // Euclidean: the floor for a positive denominator
	return q.Int64()
}

func ceilRat(x *big.Rat) int64 {
	return -floorRat(new(big.Rat).Neg(x))
}

// modelCheck decides a check (or a peek) of cost under limit at now, by
// the rules a plan change follows (tokenbucket's State.Step): the band is
// refilled at the rate of the policy that wrote it, capped at its
// capacity; a full band is a missing one, and a missing one is full under
// the new policy; another policy takes the lesser of the whole tokens and
// its capacity, and below it the part of a token, rounded down to its own
// units (1/p of a token: exact here, the plans' periods dividing each
// other); a check that takes tokens writes the band under the new policy,
// and so does a denied check that converted it; a peek writes nothing. It returns the decision's Allowed, Remaining,
// RetryAfter, ResetAfter and Converted.
func modelCheck(b *modelBand, limit ratelimit.Limit, cost int64, peek bool, now int64) (allowed bool, remaining int64, retry, reset time.Duration, converted bool) {
	c, r, p := modelRate(limit)
	x := ratOf(c)
	if b.tokens != nil {
		oc, or, op := modelRate(b.limit)
		x = new(big.Rat).Add(b.tokens, new(big.Rat).SetFrac64((now-b.last)*or, op))
		if x.Cmp(ratOf(oc)) >= 0 {
			x = ratOf(c) // full: as missing
		} else if oc != c || or != r || op != p {
			converted = true
			tok := floorRat(x)
			if tok >= c {
				x = ratOf(c)
			} else {
				frac := new(big.Rat).Sub(x, ratOf(tok))
				units := floorRat(new(big.Rat).Mul(frac, ratOf(p)))
				x = new(big.Rat).Add(ratOf(tok), new(big.Rat).SetFrac64(units, p))
			}
		}
	}
	need := cost
	if peek {
		need = 1
	}
	allowed = x.Cmp(ratOf(need)) >= 0
	if allowed && !peek {
		x = new(big.Rat).Sub(x, ratOf(cost))
		*b = modelBand{limit: limit, tokens: x, last: now}
	} else if converted && !peek {
		// A denied check writes the band it converted, so that it refills
		// at its new policy's rate from now on.
		*b = modelBand{limit: limit, tokens: x, last: now}
	}
	if !allowed {
		retry = time.Duration(ceilRat(new(big.Rat).Mul(new(big.Rat).Sub(ratOf(need), x), new(big.Rat).SetFrac64(p, r)))) * time.Microsecond
	}
	reset = time.Duration(ceilRat(new(big.Rat).Mul(new(big.Rat).Sub(ratOf(c), x), new(big.Rat).SetFrac64(p, r)))) * time.Microsecond
	return allowed, max(0, floorRat(x)), retry, reset, converted
}

// TestPlansModel: random checks and peeks of a few subjects, interleaved
// with plan changes (to another plan, to a policy of the subject's own,
// back to the default), through Plans on memstore with an injected clock,
// each decision held to the model of the carry-over rules (modelCheck), to
// the token and the microsecond.
func TestPlansModel(t *testing.T) {
	seeds := []uint64{1, 2, 3, 4}
	if *planModelSeed != 0 {
		seeds = []uint64{*planModelSeed}
	}
	// Periods in lowest terms of 20 s, 10 s, 1 s, 200 ms and 100 ms: each
	// divides the ones before it, so the carried part of a token is exact.
	plans := []ratelimit.Plan{
		{Name: "free", Limits: []ratelimit.Limit{ratelimit.PerMinute(3)}},
		{Name: "strict", Limits: []ratelimit.Limit{{Capacity: 2, RefillTokens: 1, RefillPeriod: 10 * time.Second}}},
		{Name: "pro", Limits: []ratelimit.Limit{ratelimit.PerMinute(60)}},
	}
	own := []ratelimit.Limit{ratelimit.NewLimit(5, time.Second, 10), ratelimit.PerSecond(10), ratelimit.NewLimit(1, 20*time.Second, 8)}
	for _, seed := range seeds {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(seed, 33))
			clock := testkit.NewClock(testkit.Start)
			p, err := ratelimit.NewPlans[string](memstore.New(memstore.WithClock(clock.Now)), plans, "free", ratelimit.WithClock(clock.Now))
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			subjects := []string{"a", "b", "c"}
			policy := map[string]ratelimit.Limit{} // each subject's, in the model
			planOf := map[string]string{}
			bands := map[string]*modelBand{}
			for _, s := range subjects {
				policy[s], planOf[s], bands[s] = plans[0].Limits[0], "free", &modelBand{}
			}
			conversions := 0
			for step := range 4000 {
				s := subjects[rng.IntN(len(subjects))]
				switch op := rng.IntN(20); {
				case op == 0: // another plan
					pl := plans[rng.IntN(len(plans))]
					if _, err := p.Assign(ctx, s, ratelimit.Assignment{Plan: pl.Name}); err != nil {
						t.Fatal(err)
					}
					policy[s], planOf[s] = pl.Limits[0], pl.Name
				case op == 1: // a policy of its own
					l := own[rng.IntN(len(own))]
					if _, err := p.Assign(ctx, s, ratelimit.Assignment{Limits: []ratelimit.Limit{l}}); err != nil {
						t.Fatal(err)
					}
					policy[s], planOf[s] = l, ""
				case op == 2: // back to the default
					if _, err := p.Assign(ctx, s, ratelimit.Assignment{}); err != nil {
						t.Fatal(err)
					}
					policy[s], planOf[s] = plans[0].Limits[0], "free"
				case op < 8:
					clock.Add(time.Duration(rng.Int64N(int64(12*time.Second))) / time.Microsecond * time.Microsecond)
				default:
					plan, lim := p.For(s)
					if plan != planOf[s] || lim.Limits()[0] != policy[s] {
						t.Fatalf("step %d: For(%s) = %q %v; want %q %v", step, s, plan, lim.Limits(), planOf[s], policy[s])
					}
					peek := op == 19
					cost := 1 + rng.Int64N(min(policy[s].Capacity, 3))
					var d ratelimit.Decision
					if peek {
						d, err = lim.Peek(ctx, s)
					} else {
						d, err = lim.TryAcquireN(ctx, s, cost)
					}
					if err != nil {
						t.Fatalf("step %d: %v", step, err)
					}
					allowed, remaining, retry, reset, converted := modelCheck(bands[s], policy[s], cost, peek, clock.Now().UnixMicro())
					if converted {
						conversions++
					}
					if d.Allowed != allowed || d.Remaining != remaining || d.RetryAfter != retry || d.ResetAfter != reset || d.Converted != converted {
						t.Fatalf("step %d: %s under %v, cost %d, peek %v: got {allowed %v remaining %d retry %v reset %v converted %v}, the model {%v %d %v %v %v}",
							step, s, policy[s], cost, peek, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter, d.Converted, allowed, remaining, retry, reset, converted)
					}
				}
			}
			if conversions < 50 {
				t.Fatalf("only %d checks met a bucket of another policy", conversions)
			}
		})
	}
}
