package fallback

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/exactlimit/ratelimit"
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
	res, ok := s.primary.(tokenbucket.Reserver)
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
	if lr.Now.IsZero() {
		lr.Now = s.clock()
	}
	d, err = s.local.Reserve(context.WithoutCancel(ctx), key, id, lr, ttl)
	d.Source = ratelimit.SourceLocal
	return d, err
}

// Settle settles reservation id where it was made: in this process when
// LocalFallback reserved it during an outage, else on the primary. A settle
// of a reservation held by the primary while the primary is down, or that
// fails to reach it, changes nothing and its error wraps ErrUnavailable,
// whatever the outage behaviour: the reservation stays on the primary, kept
// as taken unless settled again before it expires.
func (s *Store) Settle(ctx context.Context, key, id string, r ratelimit.Request, actual []int64) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateSettle(id, r, actual); err != nil {
		return ratelimit.Decision{}, err
	}
	res, ok := s.primary.(tokenbucket.Reserver)
	if !ok {
		return ratelimit.Decision{}, fmt.Errorf("fallback: the primary cannot hold reservations: %w", errors.ErrUnsupported)
	}
	if s.outage == LocalFallback {
		lr := s.shared(r)
		if lr.Now.IsZero() {
			lr.Now = s.clock()
		}
		if d, err := s.local.Settle(ctx, key, id, lr, actual); !errors.Is(err, ratelimit.ErrNotReserved) {
			d.Source = ratelimit.SourceLocal
			return d, err
		}
	}
	d, cause, err := s.guard(ctx, key, func(ctx context.Context) (ratelimit.Decision, error) {
		return res.Settle(ctx, key, id, r, actual)
	})
	if cause != nil {
		if err == nil {
			err = s.partition(ctx, key).unavailable()
		} else {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return ratelimit.Decision{}, err
	}
	return d, err
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
// error wrapping ErrUnavailable.
func (s *Store) Refund(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := tokenbucket.ValidateRefund(r); err != nil {
		return ratelimit.Decision{}, err
	}
	res, ok := s.primary.(tokenbucket.Refunder)
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
		lr := s.shared(r)
		if lr.Now.IsZero() {
			lr.Now = s.clock()
		}
		d, err = s.local.Refund(context.WithoutCancel(ctx), key, lr)
		d.Source = ratelimit.SourceLocal
		return d, err
	}
	if err == nil {
		return ratelimit.Decision{}, s.partition(ctx, key).unavailable()
	}
	return ratelimit.Decision{}, fmt.Errorf("%w: %w", ErrUnavailable, err)
}
