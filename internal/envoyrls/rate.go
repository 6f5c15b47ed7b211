package envoyrls

import (
	"fmt"
	"math/big"
	"strings"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// maxRoundingError is the largest share of a refill rate that bucketLimit
// gives up to keep a rule within the arithmetic's bounds: one part in 10^9.
const maxRoundingError = 1e-9

// bucketLimit returns the Limit of capacity tokens refilling n every per.
// When that Limit is beyond the bucket arithmetic's bounds (capacity times
// the period in lowest terms above 2^53, see ratelimit.Limit.Validate), the
// refill rate is rounded down to the nearest rate below it that fits, and
// rounded is true; the capacity stays exact and the rate never goes up, so
// the bucket never admits more than the rule. A rate that would lose more
// than one part in 10^9 is an error, as is a capacity beyond 2^53.
func bucketLimit(capacity, n int64, per time.Duration) (l ratelimit.Limit, rounded bool, err error) {
	l = ratelimit.Limit{Capacity: capacity, RefillTokens: n, RefillPeriod: per}
	verr := l.Validate()
	if verr == nil {
		return l, false, nil
	}
	fail := func(e error) (ratelimit.Limit, bool, error) {
		return l, false, fmt.Errorf("%d requests per %v with a capacity of %d cannot be kept: %v",
			n, per, capacity, strings.TrimPrefix(e.Error(), ratelimit.ErrInvalidArgument.Error()+": "))
	}
	if capacity < 1 || capacity > tokenbucket.MaxExact || n < 1 || per < time.Microsecond || per%time.Microsecond != 0 {
		return fail(verr)
	}
	maxPeriod := tokenbucket.MaxExact / capacity // µs, in lowest terms
	tokens, micros := lowerApprox(n, per.Microseconds(), maxPeriod)
	if tokens < 1 {
		return fail(verr)
	}
	// The share lost: 1 - (tokens/micros)/(n/p) = (n·micros - tokens·p)/(n·micros).
	p := big.NewInt(per.Microseconds())
	exact := new(big.Int).Mul(big.NewInt(n), big.NewInt(micros))
	lost := new(big.Int).Sub(exact, new(big.Int).Mul(big.NewInt(tokens), p))
	if new(big.Float).Quo(new(big.Float).SetInt(lost), new(big.Float).SetInt(exact)).Cmp(big.NewFloat(maxRoundingError)) > 0 {
		return fail(verr)
	}
	r := ratelimit.Limit{Capacity: capacity, RefillTokens: tokens, RefillPeriod: time.Duration(micros) * time.Microsecond}
	if err := r.Validate(); err != nil {
		return fail(err)
	}
	return r, true, nil
}

// lowerApprox returns the largest fraction a/q at most n/p with q at most
// maxQ, in lowest terms, by a walk down the Stern-Brocot tree that takes
// each run of same-side steps at once. n, p and maxQ are at least 1.
func lowerApprox(n, p, maxQ int64) (a, q int64) {
	N, P, Q := big.NewInt(n), big.NewInt(p), big.NewInt(maxQ)
	la, lq := big.NewInt(0), big.NewInt(1) // lower bound, at most n/p
	ha, hq := big.NewInt(1), big.NewInt(0) // upper bound, above n/p
	t, x, y := new(big.Int), new(big.Int), new(big.Int)
	for {
		// Lower: the most steps t toward the upper bound that stay at
		// most n/p, t = floor((n·lq - p·la) / (p·ha - n·hq)), and keep the
		// denominator within maxQ.
		x.Sub(x.Mul(N, lq), y.Mul(P, la))
		y.Sub(y.Mul(P, ha), t.Mul(N, hq))
		t.Quo(x, y)
		limited := false
		if hq.Sign() > 0 {
			if room := new(big.Int).Quo(new(big.Int).Sub(Q, lq), hq); room.Cmp(t) < 0 {
				t, limited = room, true
			}
		}
		la.Add(la, new(big.Int).Mul(t, ha))
		lq.Add(lq, new(big.Int).Mul(t, hq))
		// Exact, or no room left below maxQ.
		x.Sub(x.Mul(N, lq), y.Mul(P, la))
		if limited || x.Sign() == 0 || new(big.Int).Add(lq, hq).Cmp(Q) > 0 && hq.Sign() > 0 {
			return result(la, lq)
		}
		// Upper: the most steps toward the lower bound that stay above
		// n/p: t = ceil((p·ha - n·hq) / (n·lq - p·la)) - 1.
		y.Sub(y.Mul(P, ha), new(big.Int).Mul(N, hq))
		t.Sub(t.Quo(t.Add(y, new(big.Int).Sub(x, big.NewInt(1))), x), big.NewInt(1))
		ha.Add(ha, new(big.Int).Mul(t, la))
		hq.Add(hq, new(big.Int).Mul(t, lq))
		if new(big.Int).Add(lq, hq).Cmp(Q) > 0 {
			return result(la, lq)
		}
	}
}

// result is a/q as int64s, or 0/1 when a does not fit one.
func result(a, q *big.Int) (int64, int64) {
	if !a.IsInt64() || !q.IsInt64() {
		return 0, 1
	}
	return a.Int64(), q.Int64()
}
