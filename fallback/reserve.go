package fallback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// Reserve reserves r as reservation id on the primary while it is alive, as
// Apply decides a check. While it is down, LocalFallback reserves from the
// local bucket, under the share, and records the reservation in this process;
// FailOpen admits without taking or recording anything (there is then nothing
// to settle); FailClosed denies; ReturnError returns the error. The primary
// must hold reservations (memstore and redisstore do), else the error wraps
// errors.ErrUnsupported.
func (s *Store) Reserve(ctx context.Context, key, id string, r ratelimit.Request, ttl time.Duration) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateReserve(id, r, ttl); err != nil {
		return ratelimit.Decision{}, err
	}
	res, ok := s.primary.(ratelimit.Reserver)
	if !ok {
		return ratelimit.Decision{}, fmt.Errorf("fallback: the primary cannot hold reservations: %w", errors.ErrUnsupported)
	}
	d, cause, err := s.guard(ctx, key, func(ctx context.Context) (ratelimit.Decision, error) {
		return res.Reserve(ctx, key, id, r, ttl)
	})
	if cause == nil {
		return d, err
	}
	if s.outage != LocalFallback {
		return s.serve(ctx, "", key, r, s.partition(ctx, key), err)
	}
	lr := s.shared(r)
	if d, denied, err := s.beyondShare(r, lr); denied || err != nil {
		return d, err
	}
	return s.onLocal(ctx, lr, func(ctx context.Context, lr ratelimit.Request) (ratelimit.Decision, error) {
		return s.local.Reserve(ctx, key, id, lr, ttl)
	})
}

// Settle settles reservation id where it was made: on the primary, or, when
// the primary does not hold it or is down, in this process, where
// LocalFallback reserved it during an outage. A settle
// of a reservation held by the primary while the primary is down, or that
// fails to reach it, changes nothing and its error wraps ratelimit.ErrUnavailable,
// whatever the outage behaviour: the reservation stays on the primary, kept
// as taken unless settled again before it expires.
//
// A settle by token, whose key is a namespace's prefix alone (see
// ratelimit.Reserver), finds the reservation by its id in either place. Its
// partition (on Cluster) is that of the reservation's record, in the
// slot the id names: the bucket's.
func (s *Store) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateSettle(id, r, actual); err != nil {
		return ratelimit.Decision{}, err
	}
	res, ok := s.primary.(ratelimit.Reserver)
	if !ok {
		return ratelimit.Decision{}, fmt.Errorf("fallback: the primary cannot hold reservations: %w", errors.ErrUnsupported)
	}
	route := key // the key whose partition the call goes to
	if keyfmt.IsPrefix(key) {
		route = keyfmt.Record(key, id)
	}
	d, cause, err := s.guard(ctx, route, func(ctx context.Context) (ratelimit.Decision, error) {
		return res.Settle(ctx, key, id, r, actual)
	})
	if s.outage == LocalFallback && (cause != nil || errors.Is(err, ratelimit.ErrNotReserved)) {
		// Not the primary's to settle, or the primary is down: it may be
		// one the local buckets reserved during an outage.
		ld, lerr := s.onLocal(ctx, s.shared(r), func(ctx context.Context, lr ratelimit.Request) (ratelimit.Decision, error) {
			return s.local.Settle(ctx, key, id, lr, actual)
		})
		if !errors.Is(lerr, ratelimit.ErrNotReserved) {
			return ld, lerr
		}
	}
	if cause != nil {
		return ratelimit.Decision{}, s.unavailable(ctx, route, err)
	}
	return d, err
}

// unavailable is the error of an operation that only the primary can do,
// which guard found down: err, the error that found it so, or the
// partition's cause when it was down already, wrapped in ratelimit.ErrUnavailable.
func (s *Store) unavailable(ctx context.Context, key string, err error) error {
	if err == nil {
		return s.partition(ctx, key).unavailable()
	}
	return wrapUnavailable(err)
}

// guard calls the primary for key, as apply does a check: not while key's
// partition is down, with WithTimeout's bound, and marking the partition
// down on an outage. It returns call's answer; or, when the outage behaviour
// should answer instead, a non-nil cause: errOutage, and err the error that
// found the primary down (nil when it was down already).
func (s *Store) guard(ctx context.Context, key string, call func(context.Context) (ratelimit.Decision, error)) (d ratelimit.Decision, cause, err error) {
	if err := ctx.Err(); err != nil {
		return d, nil, err
	}
	p := s.partition(ctx, key)
	gen := p.gen.Load()
	if gen&1 != 0 {
		return d, errOutage, nil
	}
	pctx, cancel := s.withTimeout(ctx)
	d, err = call(pctx)
	cancel()
	if err == nil {
		p.answered.Add(1)
		return d, nil, nil
	}
	switch s.failure(ctx, p, err) {
	case callerGaveUp, notOutage:
		return d, nil, err
	case callerDeadline:
		return d, errOutage, err
	}
	s.down(ctx, p, gen, err)
	return d, errOutage, err
}

// errOutage is guard's cause: the outage behaviour answers.
var errOutage = errors.New("fallback: primary down")

// Refund gives r's cost back to the bucket at key (see memstore's and
// redisstore's Refund): on the primary while it is alive; while it is down,
// under LocalFallback to the local bucket, and otherwise not at all, with an
// error wrapping ratelimit.ErrUnavailable.
func (s *Store) Refund(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateRefund(r); err != nil {
		return ratelimit.Decision{}, err
	}
	res, ok := s.primary.(ratelimit.Refunder)
	if !ok {
		return ratelimit.Decision{}, fmt.Errorf("fallback: the primary cannot refund: %w", errors.ErrUnsupported)
	}
	d, cause, err := s.guard(ctx, key, func(ctx context.Context) (ratelimit.Decision, error) {
		return res.Refund(ctx, key, r)
	})
	if cause == nil {
		return d, err
	}
	if s.outage == LocalFallback {
		return s.onLocal(ctx, s.shared(r), func(ctx context.Context, lr ratelimit.Request) (ratelimit.Decision, error) {
			return s.local.Refund(ctx, key, lr)
		})
	}
	return ratelimit.Decision{}, s.unavailable(ctx, key, err)
}
