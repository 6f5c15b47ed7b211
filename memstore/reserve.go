package memstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// defaultMaxReservations is the most open reservations a Store holds
// without WithMaxReservations: about 250 MB of records.
const defaultMaxReservations = 1_000_000

// errTooManyReservations is the error of a reserve refused because the store
// holds its most open reservations (see WithMaxReservations).
var errTooManyReservations = errors.New("memstore: too many open reservations")

// WithMaxReservations sets the most reservations the store holds open
// (reserved, not settled, and within their ttl) at a time; the default is
// 1,000,000, and n below 1 keeps it. A reserve past it is refused with an
// error before it takes anything: the store would otherwise keep a record of
// about 250 bytes per reservation for as long as its ttl.
func WithMaxReservations(n int) Option {
	return func(s *Store) {
		if n >= 1 {
			s.reserved.most = n
		}
	}
}

// reservations holds the records of a Store's reservations that are not
// settled yet, by id, each until it expires on the store's clock.
type reservations struct {
	mu      sync.Mutex
	m       map[string]reservation
	sweepAt int   // the size at which to drop the expired records next
	most    int   // the most open reservations; 0 for the default
	taking  int   // reserves between their room and their record
	soonest int64 // µs on the store's clock: no record expires before it
}

type reservation struct {
	key     string // the bucket's
	holds   []tokenbucket.Hold
	expires int64 // µs on the store's clock
}

// Reserve decides r against the bucket at key as Apply does and, when it is
// allowed, records what each limit took as reservation id, kept for ttl on
// the store's clock. Limiter.Reserve calls it; see ratelimit.Reservation.
func (s *Store) Reserve(ctx context.Context, key, id string, r ratelimit.Request, ttl time.Duration) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateReserve(id, r, ttl); err != nil {
		return ratelimit.Decision{}, err
	}
	// Room for the record is kept before the bucket is touched, so that a
	// refused reserve takes nothing.
	rs := &s.reserved
	rs.mu.Lock()
	most := rs.most
	if most == 0 {
		most = defaultMaxReservations
	}
	if len(rs.m)+rs.taking >= most {
		if clock := s.now(); clock >= rs.soonest {
			rs.sweep(clock)
		}
		if open := len(rs.m) + rs.taking; open >= most {
			rs.mu.Unlock()
			return ratelimit.Decision{}, fmt.Errorf("%w: %d open, at most %d (memstore.WithMaxReservations); reserve of %s refused",
				errTooManyReservations, open, most, keyfmt.Label(key))
		}
	}
	rs.taking++
	rs.mu.Unlock()
	// The holds of quotas are of the windows at the time the bucket was
	// decided at: its Last once the reserve took.
	var at int64
	err := ctx.Err()
	var d ratelimit.Decision
	if err == nil {
		d, err = s.update(key, r, func(st *tokenbucket.State, us int64) (ratelimit.Decision, time.Duration, bool) {
			d, ttl, write := st.Step(r, us)
			at = st.Last
			return d, ttl, write
		})
	}
	// No one can settle the reservation before it is recorded: no one
	// knows its id.
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.taking--
	if err != nil || !d.Allowed {
		return d, err
	}
	clock := s.now()
	if rs.m == nil {
		rs.m = make(map[string]reservation)
	}
	if len(rs.m) >= rs.sweepAt {
		rs.sweep(clock)
	}
	expires := clock + ttl.Microseconds()
	if len(rs.m) == 0 || expires < rs.soonest {
		rs.soonest = expires
	}
	rs.m[id] = reservation{key: key, holds: tokenbucket.Held(r, at), expires: expires}
	return d, nil
}

// sweep drops the records expired at clock, under rs.mu, and notes when the
// next one expires.
func (rs *reservations) sweep(clock int64) {
	soonest := int64(math.MaxInt64)
	for k, v := range rs.m {
		if v.expires <= clock {
			delete(rs.m, k)
		} else {
			soonest = min(soonest, v.expires)
		}
	}
	rs.sweepAt = max(64, 2*len(rs.m))
	rs.soonest = soonest
}

// Settle settles reservation id on the bucket at key with actual, the tokens
// each of r's limits really used, as tokenbucket's Settle does. The record is
// taken out first, so of two settles of one reservation one finds it; without
// a record (settled already, or expired) nothing changes, and the error wraps
// ratelimit.ErrNotReserved beside the bucket's standing. When key is a
// namespace's prefix alone, or empty (a settle by token: see
// ratelimit.Reserver), the bucket is the one the record names, when it is
// in the namespace; without such a record the Decision is zero.
func (s *Store) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateSettle(id, r, actual); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	byRecord := keyfmt.IsPrefix(key)
	rs := &s.reserved
	rs.mu.Lock()
	rec, found := rs.m[id]
	if found && (rec.key == key || byRecord && len(rec.key) > len(key) && rec.key[:len(key)] == key) {
		delete(rs.m, id)
		key = rec.key
	} else {
		found = false // another bucket's, or another namespace's: not found here
	}
	rs.mu.Unlock()
	clock := s.now()
	if (!found || rec.expires <= clock) && byRecord {
		return ratelimit.Decision{}, fmt.Errorf("%w: memstore settle in %s", ratelimit.ErrNotReserved, keyfmt.Label(key))
	}
	if !found || rec.expires <= clock {
		d, err := s.Apply(ctx, key, ratelimit.Request{Limits: r.Limits, Peek: true, Now: r.Now})
		if err != nil {
			return d, err
		}
		return d, fmt.Errorf("%w: memstore settle of %s", ratelimit.ErrNotReserved, keyfmt.Label(key))
	}
	return s.update(key, r, func(st *tokenbucket.State, us int64) (ratelimit.Decision, time.Duration, bool) {
		return st.Settle(r, rec.holds, actual, us)
	})
}

// Refund gives r's cost (or costs) back to the bucket at key, capped at each
// limit's capacity (tokenbucket's Refund): for a protocol that refunds without
// a reservation (Envoy's negative hits). r is validated as a check is.
func (s *Store) Refund(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateRefund(r); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	return s.update(key, r, func(st *tokenbucket.State, us int64) (ratelimit.Decision, time.Duration, bool) {
		return st.Refund(r, us)
	})
}

// update runs op on the bucket at key under its shard's lock, at r's time or
// the store's, and stores what it leaves when it says to write.
func (s *Store) update(key string, r ratelimit.Request, op func(st *tokenbucket.State, us int64) (ratelimit.Decision, time.Duration, bool)) (ratelimit.Decision, error) {
	clock := s.now()
	us := clock
	if !r.Now.IsZero() {
		us = r.Now.UnixMicro()
	}
	prefix, subject := keyfmt.Split(key)
	sh := s.shardOf(prefix, subject)
	sh.mu.Lock()
	defer sh.unlock()
	p := s.policyIn(sh, r.Limits, r.Quotas)
	sp := sh.spaces[prefix]
	var bands [tokenbucket.MaxLimits]tokenbucket.Band
	st, e := sh.load(sp, subject, &bands)
	d, ttl, write := op(&st, us)
	if write {
		s.store(sh, sp, prefix, subject, st, p, e, s.expiry(clock, ttl))
	}
	return d, nil
}
