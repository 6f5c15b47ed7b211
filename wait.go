package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// minWait is the least Wait sleeps between tries, so that a denial that
// reports no wait (a store that rounds it away) cannot make it spin.
const minWait = time.Millisecond

// withSleep sets how Wait and WaitN sleep between tries: sleep must return
// after d, or earlier with ctx's error when ctx ends first. The default is a
// timer that does exactly that. A test that injects WithClock injects a sleep
// that advances the same clock by d, and its waits then take no real time.
// sleep must not be nil.
func withSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(o *options) {
		if sleep == nil {
			o.errs = append(o.errs, invalid("sleep must not be nil"))
			return
		}
		o.sleep = sleep
	}
}

// Wait takes one token for subject, waiting until its bucket holds one; see
// WaitN.
func (l *Limiter[K]) Wait(ctx context.Context, subject K) (Decision, error) {
	return l.WaitN(ctx, subject, 1)
}

// WaitN takes cost tokens for subject, waiting until its bucket holds them.
// It checks as TryAcquireN does; while the check is denied, it sleeps for the
// Decision's RetryAfter plus a little random jitter (up to a tenth of
// RetryAfter, plus up to 1 ms, so that a fleet denied at the same moment does
// not retry in step) and checks again. It returns the Decision of the check
// that admitted the cost.
//
// It returns early, having taken nothing, when:
//
//   - the wait a denial reports would end after ctx's deadline: WaitN
//     returns at once, without sleeping, the denial's Decision (its
//     RetryAfter says how long the wait would have been) and an error that
//     says "would exceed context deadline" and wraps
//     context.DeadlineExceeded, so errors.Is(err, context.DeadlineExceeded)
//     holds as when the deadline has passed. The jitter is left out of a
//     sleep that would otherwise end after the deadline.
//   - ctx ends before a check admits the cost: the error is ctx.Err(). A
//     check that ctx cut off in flight may still have been decided by the
//     store, as for TryAcquireN.
//   - the wait could never end: cost outside 1..capacity, or an invalid
//     subject. The error wraps ErrInvalidArgument and no store is called.
//   - a check fails: its error is returned at once, not retried. A store
//     with an outage behaviour (package fallback) decides inside the store,
//     so its denials (FailClosed, or a local share too small for cost) are
//     waited out like any other, until the primary answers again, and its
//     admissions (FailOpen) end the wait.
//
// A waiter is not a queue: each try is one check on the shared bucket (with
// redisstore, one script call), and waiters are not served in the order they
// started, in this process or across the fleet. A waiter for a large cost can
// wait indefinitely behind a stream of small ones. Sleeping is done with the
// function of withSleep.
func (l *Limiter[K]) WaitN(ctx context.Context, subject K, cost int64) (Decision, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Decision{}, err
		}
		d, err := l.TryAcquireN(ctx, subject, cost)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil && !errors.Is(err, ErrInvalidArgument) {
				return Decision{}, cerr
			}
			return Decision{}, err
		}
		if d.Allowed {
			return d, nil
		}
		wait := max(d.RetryAfter, minWait)
		jitter := time.Duration(l.jitter(int64(wait/10 + time.Millisecond)))
		if deadline, ok := ctx.Deadline(); ok {
			// A context's deadline is on the wall clock, whatever clock
			// the buckets are decided on (WithClock).
			left := time.Until(deadline)
			if wait > left {
				return d, fmt.Errorf("ratelimit: wait of %v would exceed context deadline: %w", wait, context.DeadlineExceeded)
			}
			if wait+jitter > left {
				jitter = 0
			}
		}
		if err := l.sleep(ctx, wait+jitter); err != nil {
			return Decision{}, err
		}
	}
}

// randJitter returns a random number in [0, n), n > 0.
func randJitter(n int64) int64 { return rand.Int64N(n) }
