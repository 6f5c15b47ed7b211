package ratelimit

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit/internal/arith"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// Reservation is tokens taken before the work whose cost they estimate, to be
// settled once the cost is known: see Limiter.Reserve.
type Reservation struct {
	// Decision is the reserve's decision. When it is not Allowed nothing
	// was taken: there is nothing to settle, and RetryAfter says when the
	// estimate would fit.
	Decision Decision
	token    string                                                      // its id; "" when denied
	settle   func(ctx context.Context, actual []int64) (Decision, error) // on its key and id
}

// Token returns the reservation as an opaque string of 24 characters ("" when
// the reserve was denied), for a process that settles it elsewhere with
// Limiter.Settle: the service's settle endpoint takes it. It is the
// reservation's id, unpadded base64url of 18 bytes: 128 random bits, and the
// Redis Cluster hash slot of the subject's bucket (2 bytes), which a settle
// needs to find the record on Redis Cluster. That slot, 14 bits of a CRC16 of
// the bucket's key, one of 16384 values, is all a token tells of the subject:
// it holds the subject in no form (on every store; memstore has no use for
// the slot). Settling needs the record the store keeps, so a token cannot be
// forged or settled twice.
func (r *Reservation) Token() string { return r.token }

// Settle settles the reservation with the tokens the work really used: one
// count for every limit and quota, or one per limit in the order of the
// limiter's Limits and then one per quota (1 and the tokens used, for a
// requests and a tokens limit). A quota's part is settled in the window it
// was reserved in: once that window has ended, the new one is left alone. What was
// reserved and not used goes back, capped at capacity; an overrun is charged,
// into debt when the bucket holds too little (see Limiter.Reserve). The
// Decision is the subject's standing afterwards, as Peek reports it. A
// reservation is settled once: a second Settle or Cancel, here or in another
// process, or one after the reservation expired, changes nothing and returns
// an error wrapping ErrNotReserved.
func (r *Reservation) Settle(ctx context.Context, actual ...int64) (Decision, error) {
	if r.token == "" {
		return r.Decision, fmt.Errorf("%w: the reserve was denied", ErrNotReserved)
	}
	return r.settle(ctx, actual)
}

// Cancel gives the whole reservation back: Settle with nothing used.
func (r *Reservation) Cancel(ctx context.Context) error {
	_, err := r.Settle(ctx, 0)
	return err
}

// Reserve takes costs from subject's bucket now, for work whose real cost is
// known only after it (a language model's tokens, an upload's bytes), and
// returns a reservation to settle when it is: costs is one cost for every
// limit and quota, or one per limit in the order of Limits and then per
// quota, each between 1 and its limit's capacity or quota's allowance,
// decided all or nothing as TryAcquireN decides. A limiter
// of PerMinute(60) requests and PerMinute(90_000) tokens reserves 1 and the
// estimate as one decision.
//
// The rules of a settle: tokens reserved and not used go back, never lifting
// a limit past its capacity and never more than was taken; an overrun takes
// what the bucket holds and the rest as debt, down to minus the limit's
// capacity at most, and while in debt every check of the subject is denied,
// its RetryAfter counting the debt. A reservation not settled within ttl
// (at least a millisecond) is kept as taken.
//
// The store keeps a record of each reservation until it is settled or its
// ttl ends, beside the bucket (in Redis, a key in the bucket's slot named by
// the reservation's id), naming the bucket, and a settle reads and deletes it
// in the same atomic step as it settles: that is what makes a second settle,
// from any process, find nothing. (A signed token alone could prove a settle
// genuine, but not tell a second one from the first.) The store must hold
// reservations (memstore, redisstore, and fallback over either do), or
// Reserve returns an error wrapping errors.ErrUnsupported. Reserve does not
// consult the denial cache.
func (l *Limiter[K]) Reserve(ctx context.Context, subject K, ttl time.Duration, costs ...int64) (*Reservation, error) {
	res, ok := l.store.(Reserver)
	if !ok {
		return nil, fmt.Errorf("ratelimit: the store cannot hold reservations: %w", errors.ErrUnsupported)
	}
	enc := l.encode(subject)
	r, err := l.reserveRequest(enc, ttl, costs)
	if err != nil {
		l.failed(ctx, l.errKey(subject), opReserve, largest(costs), err, time.Time{})
		return nil, err
	}
	key := l.prefix + enc
	id := keyfmt.ReservationID(key)
	start := time.Now()
	d, err := res.Reserve(ctx, key, id, r, ttl)
	if err != nil {
		l.failed(ctx, key, opReserve, largest(costs), err, start)
		return nil, err
	}
	l.decided(ctx, key, largest(costs), false, d, start)
	rv := &Reservation{Decision: d}
	if d.Allowed {
		rv.token = id
		rv.settle = func(ctx context.Context, actual []int64) (Decision, error) {
			return l.settle(ctx, key, id, actual)
		}
	}
	return rv, nil
}

// reserveRequest validates a reserve of costs for the encoded subject enc.
func (l *Limiter[K]) reserveRequest(enc string, ttl time.Duration, costs []int64) (Request, error) {
	r := Request{Limits: l.limits, Quotas: l.quotas, policy: l.policy}
	switch {
	case enc == "":
		return r, invalid("subject must not be empty")
	case ttl < time.Millisecond:
		return r, invalid("reservation lifetime must be at least 1ms (got %v)", ttl)
	case len(costs) == 1:
		r.Cost = costs[0]
		if err := validateCost(l.limits, l.quotas, r.Cost); err != nil {
			return r, err
		}
	default:
		r.Costs = costs
		if err := validateCosts(l.limits, l.quotas, costs); err != nil {
			return r, err
		}
	}
	return l.timed(r)
}

// timed sets r's time from the limiter's clock, when it has one.
func (l *Limiter[K]) timed(r Request) (Request, error) {
	if l.clock != nil {
		r.Now = l.clock()
		if _, rule := arith.Micros(r.Now); rule != "" {
			return r, invalid("%s", rule)
		}
	}
	return r, nil
}

// Settle settles the reservation whose Token is token, from this process or
// any other sharing the store, as Reservation.Settle does. A token that is
// not a reservation's is an error wrapping ErrInvalidArgument, and one of
// another limiter's (another namespace) finds no reservation. Since a token
// does not name the subject, the store finds the bucket from its record (see
// Reserver); a Decision with ErrNotReserved is then zero, and the
// denial cache (WithDenyCache) is not told of the refund, as it is not of a
// settle in another process: a subject it holds stays denied here for at
// most the rest of its last wait. The ErrorEvent of a settle by token has no
// Key.
func (l *Limiter[K]) Settle(ctx context.Context, token string, actual ...int64) (Decision, error) {
	if _, ok := keyfmt.IDSlot(token); !ok {
		err := invalid("not a reservation token")
		l.failed(ctx, "", opSettle, largest(actual), err, time.Time{})
		return Decision{}, err
	}
	return l.settle(ctx, l.prefix, token, actual)
}

// settle settles reservation id of the bucket at key with actual; key is the
// limiter's prefix alone for a settle by token, which does not know the
// bucket.
func (l *Limiter[K]) settle(ctx context.Context, key, id string, actual []int64) (Decision, error) {
	byToken := key == l.prefix
	label := key
	if byToken {
		label = "" // (an event's Key is a bucket's, or none)
	}
	res, ok := l.store.(Reserver)
	if !ok {
		return Decision{}, fmt.Errorf("ratelimit: the store cannot hold reservations: %w", errors.ErrUnsupported)
	}
	used, err := l.used(actual)
	var r Request
	if err == nil {
		r, err = l.timed(Request{Limits: l.limits, Quotas: l.quotas, policy: l.policy})
	}
	if err != nil {
		l.failed(ctx, label, opSettle, largest(actual), err, time.Time{})
		return Decision{}, err
	}
	start := time.Now()
	d, err := res.Settle(ctx, key, id, r, used)
	if l.cache != nil && !byToken {
		// A refund can admit what the cache would deny.
		l.cache.forget(key)
	}
	if err != nil {
		l.failed(ctx, label, opSettle, largest(actual), err, start)
	}
	return d, err
}

// used expands a settle's counts to one per limit and quota.
func (l *Limiter[K]) used(actual []int64) ([]int64, error) {
	n := len(l.limits) + len(l.quotas)
	switch {
	case len(actual) == n:
	case len(actual) == 1:
		one := actual[0]
		actual = make([]int64, n)
		for i := range actual {
			actual[i] = one
		}
	case len(l.quotas) == 0:
		return nil, invalid("settle takes one count, or one per limit (got %d for %d limits)", len(actual), len(l.limits))
	default:
		return nil, invalid("settle takes one count, or one per limit and quota (got %d for %d limits and %d quotas)", len(actual), len(l.limits), len(l.quotas))
	}
	for i, a := range actual {
		if a < 0 || a > arith.MaxExact {
			if i >= len(l.limits) {
				return nil, invalid("tokens used of quota %d must be between 0 and 2^53 (got %d)", i-len(l.limits), a)
			}
			return nil, invalid("tokens used of limit %d must be between 0 and 2^53 (got %d)", i, a)
		}
	}
	return actual, nil
}

// newReservationID returns 128 random bits, base64url: 22 bytes.
func newReservationID() string {
	var b [16]byte
	rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// largest is the cost an event reports of several: the largest.
func largest(costs []int64) int64 {
	var n int64
	for _, c := range costs {
		n = max(n, c)
	}
	return n
}
