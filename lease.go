package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The sizes of a lease (see WithLeases).
const (
	// leaseWindow: a lease holds about the tokens its subject asked for in
	// this process over this long, at the rate measured since the last
	// renewal.
	leaseWindow = 4 * time.Millisecond
	// leaseShare: a lease holds at most capacity/leaseShare tokens of the
	// smallest limit, and at least 1.
	leaseShare = 16
	// leaseRecordSlack: the store keeps a lease's record this much longer
	// than the lease lives, for a return that waits for the next check's
	// sweep.
	leaseRecordSlack = 10 * time.Second
	// leaseReturners: the most give-backs of leases in flight at a time,
	// each on a goroutine that ends when none is waiting.
	leaseReturners = 4
	// leaseReturnQueue: the most give-backs that checks and sweeps leave
	// waiting for a returner; one past it is not made, and its tokens are
	// lost (Close's always wait).
	leaseReturnQueue = 4096
	// leaseReturnTimeout bounds each give-back; one that runs out of time
	// leaves its tokens taken.
	leaseReturnTimeout = time.Second
)

// WithLeases makes the limiter serve subjects it checks often from leases:
// tokens it takes from the shared bucket ahead of need, in one reservation
// (see Limiter.Reserve), and then admits from in this process without a
// store call, renewing a lease when a quarter of it is left. It is off by
// default, and the store must hold reservations (memstore, redisstore, and
// fallback over either do), else New's error wraps errors.ErrUnsupported.
// Only TryAcquire, TryAcquireN, Wait and WaitN use leases; Peek, Reserve,
// TryAcquireMany and Reset go to the store as always. Decisions served from
// a lease have Source SourceLease; Limiter.LeaseStats counts the leases, and
// Limiter.Close gives back what is left of them.
//
// A lease holds the tokens the subject asked for in this process over the
// last 4 ms, measured on the limiter's clock (WithClock), at most
// max(1, C/16) tokens with C the smallest capacity of the policy: call that
// M. A subject whose lease would be used up by the check at hand (one that
// asks for under a token per 4 ms, say) and a cost above M are checked
// through the store as without leases. A lease lives for lifetime (at least
// 1 ms): what is left of it then goes back to the bucket, settled, from the
// next check of any subject of the limiter, or from Close. Give-backs are
// made in the background, by at most 4 goroutines at a time, each within a
// second: a check waits for none of them but those of its own subject, and
// for those only before it asks the store, at most until its context ends
// (or a second). Leases of P processes on one subject keep these promises:
//
//   - Never more is admitted than the policy allows: a process admits only
//     with tokens the store has already taken from the shared bucket, and
//     gives back only what it did not use, capped at capacity.
//   - At most P·M tokens sit unused in leases at a time (M per process: a
//     renewal takes at most M less what is in hand), each back in the bucket
//     within its lifetime when the process keeps checking or closes. For
//     PerSecond(1000) and 4 processes: at most 4·62 = 248 tokens.
//   - A lease-served denial is made only while the shared bucket and every
//     lease hold fewer than P·M tokens in all: after the store denied this
//     process a lease of n <= M tokens, it denies what its lease cannot
//     cover for the wait the store gave, until the bucket holds n.
//   - A decision served from a lease reports as Remaining the tokens left in
//     this process's lease plus the shared bucket's balance at this
//     process's last lease call (tokens taken by other processes since, and
//     refill since, are not counted), capped at the binding limit's
//     capacity; RetryAfter is zero when allowed and, when denied, the rest
//     of the store's wait for the lease this process asked for: the time it
//     will ask again. ResetAfter is the store's at that call, counted down.
//
// A store error on a renewal (an outage) does not stop a lease in hand: it
// is spent, each such decision counted as LeaseStats.Degraded, and once it
// cannot cover a check, the check goes to the store, whose error or outage
// behaviour (fallback's) applies as without leases; leases are renewed again
// after a check through the store succeeds. A lease whose return fails is
// kept as taken (LeaseStats.Lost): fewer admitted, never more. So is one
// whose return is not made: one that 4096 others wait ahead of, or one
// abandoned by a Close whose context ended first.
//
// A process that stops checking without Close leaves its leases to expire
// in the store, taken: at most M per subject, refilled as the bucket
// refills. A Reset does not touch leases in hand. Leases are for a few hot
// subjects: the limiter keeps a record per subject it checked within a
// lifetime, and sweeps them all every half lifetime of its clock, and at
// once when the clock goes back by more than half a lifetime; after such a
// step, the records and leases of the subjects no longer checked end within
// a lifetime or two of the clock.
func WithLeases(lifetime time.Duration) Option {
	return func(o *options) {
		if lifetime < time.Millisecond {
			o.errs = append(o.errs, invalid("lease lifetime must be at least 1ms (got %v)", lifetime))
			return
		}
		o.leases = lifetime
	}
}

// LeaseStats counts a limiter's leases (see WithLeases) since it was built.
type LeaseStats struct {
	// Taken counts the leases the store granted.
	Taken uint64
	// Returned counts the leases whose unused tokens went back to the
	// shared bucket (a lease used up has nothing to return).
	Returned uint64
	// Tokens is the number of tokens in this process's leases now, not yet
	// used; those being given back are no longer counted.
	Tokens int64
	// Local counts the decisions served from leases without a store call,
	// admitted or denied: those with Source SourceLease.
	Local uint64
	// Degraded counts the Local decisions admitted from a lease whose
	// renewal had failed (see WithLeases).
	Degraded uint64
	// Lost counts the unused tokens of leases that could not be returned
	// (the store failed or took over a second, or kept the lease's record
	// for less than its lifetime) or whose return was not made (see
	// WithLeases): kept as taken.
	Lost int64
}

// LeaseStats returns a snapshot of the limiter's lease counts; the zero
// LeaseStats without WithLeases.
func (l *Limiter[K]) LeaseStats() LeaseStats {
	ls := l.leases
	if ls == nil {
		return LeaseStats{}
	}
	s := LeaseStats{
		Taken:    ls.taken.Load(),
		Returned: ls.returned.Load(),
		Local:    ls.local.Load(),
		Degraded: ls.degraded.Load(),
		Lost:     ls.lost.Load(),
	}
	ls.mu.RLock()
	for _, e := range ls.m {
		e.mu.Lock()
		s.Tokens += e.held
		s.Local += e.local
		s.Degraded += e.degraded
		e.mu.Unlock()
	}
	ls.mu.RUnlock()
	return s
}

// leases is a limiter's lease mode: the leases this process holds, by
// encoded subject.
type leases struct {
	res      Reserver
	lifetime time.Duration
	ttl      time.Duration // of a lease's record in the store
	most     int64         // the largest lease, M

	mu sync.RWMutex
	m  map[string]*lease

	closed  atomic.Bool
	sweepAt atomic.Int64 // µs on the clock

	taken, returned atomic.Uint64
	local, degraded atomic.Uint64 // of the subjects swept
	lost            atomic.Int64

	// The give-backs (see giveBack): those waiting, and the returners
	// settling them. A lease's mu is never held with rmu.
	stop      context.Context    // of every give-back; ended by a Close that runs out of time
	cancel    context.CancelFunc // ends stop
	rmu       sync.Mutex
	queue     []leaseReturn // waiting for a returner, oldest first
	returners int
	owed      int64         // the unused tokens of the give-backs waiting or in flight
	owing     int           // those give-backs
	drained   chan struct{} // closed when owing falls to 0; nil while it is 0
}

// lease is one subject's lease in this process, and what decides its size.
type lease struct {
	enc, key string

	mu       sync.Mutex
	dead     bool          // swept or closed: look the subject up again
	grants   []grant       // the reservations in hand, oldest first
	held     int64         // their unused tokens
	size     int64         // the tokens in hand after the last grant
	renewing chan struct{} // closed when the renewal in flight ends
	outage   bool          // a renewal failed: spend the lease, then ask the store
	until    time.Time     // after a denied renewal: deny what the lease cannot cover until then
	last     Decision      // the store's decision on the last renewal
	lastAt   time.Time
	asked    int64         // tokens asked for since the last renewal
	since    time.Time     // the last renewal, or the first check
	seen     time.Time     // the last check
	owing    int           // give-backs of its grants waiting or in flight
	returned chan struct{} // closed when owing falls to 0; nil while it is 0

	local, degraded uint64
}

// newLeases sets up the lease mode of a limiter whose smallest capacity is
// minCap.
func newLeases(store Store, lifetime time.Duration, minCap int64) (*leases, error) {
	res, ok := store.(Reserver)
	if !ok {
		return nil, fmt.Errorf("ratelimit: leases need a store that holds reservations: %w", errors.ErrUnsupported)
	}
	ls := &leases{
		res:      res,
		lifetime: lifetime,
		ttl:      lifetime + leaseRecordSlack,
		most:     max(1, minCap/leaseShare),
		m:        make(map[string]*lease),
	}
	ls.stop, ls.cancel = context.WithCancel(context.Background())
	return ls, nil
}

// now reads the limiter's clock, or the host's without WithClock.
func (l *Limiter[K]) now() time.Time {
	if l.clock != nil {
		return l.clock()
	}
	return time.Now()
}

// acquireLeased is TryAcquireN in lease mode.
func (l *Limiter[K]) acquireLeased(ctx context.Context, subject K, cost int64) (Decision, error) {
	ls := l.leases
	now := l.now()
	var r Request
	enc, err := l.subjectRequest(&r, subject, cost, false, now)
	if err != nil {
		l.failed(ctx, l.errKey(subject), opAcquire, cost, err, time.Time{})
		return Decision{}, err
	}
	if cost > ls.most || ls.closed.Load() {
		return l.apply(ctx, l.prefix+enc, r)
	}
	if us, at := now.UnixMicro(), ls.sweepAt.Load(); us >= at || us < at-ls.lifetime.Microseconds() {
		l.sweep(now)
	}
	var start time.Time
	if l.obs != nil {
		start = time.Now()
	}
	counted, renewed, waited := false, false, false
	for {
		e := l.lease(enc, now)
		e.mu.Lock()
		if e.dead {
			e.mu.Unlock()
			if ls.closed.Load() {
				return l.apply(ctx, e.key, r)
			}
			continue
		}
		if !counted {
			counted = true
			e.asked += cost
			e.seen = now
		}
		expired := e.expire(now, nil)
		if e.held >= cost {
			e.take(cost)
			d := e.decision(true, now)
			e.local++
			if e.outage {
				e.degraded++
			}
			want := e.renewal(ls, now, 0, true)
			e.mu.Unlock()
			l.giveBack(expired, nil)
			if l.obs != nil {
				l.decided(ctx, e.key, cost, false, d, start)
			}
			if want > 0 {
				l.renew(ctx, e, want)
			}
			return d, nil
		}
		switch {
		case e.outage:
			e.mu.Unlock()
			l.giveBack(expired, nil)
			d, err := l.apply(ctx, e.key, r)
			if err == nil && d.Source == SourceStore {
				e.mu.Lock()
				e.outage = false
				e.mu.Unlock()
			}
			return d, err
		case e.renewing != nil:
			ch := e.renewing
			e.mu.Unlock()
			l.giveBack(expired, nil)
			select {
			case <-ch:
			case <-ctx.Done():
				err := ctx.Err()
				l.failed(ctx, e.key, opAcquire, cost, err, start)
				return Decision{}, err
			}
			continue
		case now.Before(e.until):
			d := e.decision(false, now)
			e.local++
			e.mu.Unlock()
			l.giveBack(expired, nil)
			if l.obs != nil {
				l.decided(ctx, e.key, cost, false, d, start)
			}
			return d, nil
		case e.returned != nil && !waited:
			// The store is asked after the give-backs of the
			// subject's grants, which may have left its bucket
			// short: waiting for them at most leaseReturnTimeout.
			waited = true
			ch := e.returned
			e.mu.Unlock()
			l.giveBack(expired, nil)
			if err := awaitReturns(ctx, ch); err != nil {
				l.failed(ctx, e.key, opAcquire, cost, err, start)
				return Decision{}, err
			}
			continue
		}
		want := int64(0)
		if !renewed {
			want = e.renewal(ls, now, cost, false)
		}
		if want == 0 {
			// Cold, or the lease just taken went to other checks. The
			// rate is measured over a window at least.
			if now.Sub(e.since) >= leaseWindow {
				e.since, e.asked = now, 0
			}
			e.mu.Unlock()
			l.giveBack(expired, nil)
			return l.apply(ctx, e.key, r)
		}
		e.mu.Unlock()
		l.giveBack(expired, nil)
		if err := l.renew(ctx, e, want); err != nil && ctx.Err() != nil {
			l.failed(ctx, e.key, opAcquire, cost, ctx.Err(), start)
			return Decision{}, ctx.Err()
		}
		renewed = true
	}
}

// lease returns the subject's lease record, adding one if it has none.
func (l *Limiter[K]) lease(enc string, now time.Time) *lease {
	ls := l.leases
	ls.mu.RLock()
	e := ls.m[enc]
	ls.mu.RUnlock()
	if e != nil {
		return e
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if e = ls.m[enc]; e == nil {
		enc = strings.Clone(enc)
		e = &lease{enc: enc, key: l.prefix + enc, since: now, seen: now}
		ls.m[enc] = e
	}
	return e
}

// decision is a decision served from e's lease at now, under e.mu (see
// WithLeases for what it reports).
func (e *lease) decision(allowed bool, now time.Time) Decision {
	d := Decision{Allowed: allowed, Limit: e.last.Limit, Source: SourceLease}
	d.Remaining = e.held + max(0, e.last.Remaining)
	if c := e.last.Limit.Capacity; c > 0 {
		d.Remaining = min(d.Remaining, c)
	}
	d.ResetAfter = max(0, e.last.ResetAfter-now.Sub(e.lastAt))
	if !allowed {
		d.RetryAfter = e.until.Sub(now)
	}
	return d
}

// sweep gives back the leases whose lifetime is over and drops the records
// of subjects not checked for a lifetime, at most once every half lifetime
// of the clock, and at once when the clock is more than half a lifetime
// behind the last sweep: it went back. Records last checked more than a
// lifetime ahead of the clock are rewound, so that they too end.
func (l *Limiter[K]) sweep(now time.Time) {
	ls := l.leases
	at, us := ls.sweepAt.Load(), now.UnixMicro()
	behind := us < at-ls.lifetime.Microseconds()
	if us < at && !behind || !ls.sweepAt.CompareAndSwap(at, now.Add(ls.lifetime/2).UnixMicro()) {
		return
	}
	var ret []leaseReturn
	ls.mu.Lock()
	for enc, e := range ls.m {
		e.mu.Lock()
		if e.seen.Sub(now) > ls.lifetime {
			e.rewind(ls, now)
		}
		ret = e.expire(now, ret)
		if len(e.grants) == 0 && e.renewing == nil && e.returned == nil && !now.Before(e.seen.Add(ls.lifetime)) {
			ret = e.bury(ls, ret)
			delete(ls.m, enc)
		}
		e.mu.Unlock()
	}
	ls.mu.Unlock()
	l.giveBack(ret, nil)
}
