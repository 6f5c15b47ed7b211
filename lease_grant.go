package ratelimit

import (
	"context"
	"time"
)

// grant is one reservation of a lease.
type grant struct {
	id      string
	n, used int64
	expires time.Time
}

// renewal decides, under e.mu, whether to renew e now, and if so how many
// tokens to ask for, marking the renewal in flight; 0 means not now. A
// renewal ahead of need (early) is made when a quarter of the lease is left;
// one for a check of cost the lease cannot cover asks for at least what it
// lacks, and is not made when the lease would be used up by that check.
func (e *lease) renewal(ls *leases, now time.Time, cost int64, early bool) int64 {
	if e.renewing != nil || e.outage || now.Before(e.until) || ls.closed.Load() {
		return 0
	}
	if early && (e.held*4 > e.size || e.returned != nil) {
		return 0
	}
	n := e.demand(ls.most, now, cost)
	if n <= max(cost, e.held) {
		return 0
	}
	e.renewing = make(chan struct{})
	e.since, e.asked = now, 0
	return n - e.held
}

// demand is the lease size e's rate calls for: the tokens asked for since
// the last renewal, scaled to leaseWindow, between 1 and most. Several
// checks at one instant call for the most; the check of cost alone, for
// cost.
func (e *lease) demand(most int64, now time.Time, cost int64) int64 {
	elapsed := now.Sub(e.since)
	if elapsed <= 0 {
		if e.asked > cost {
			return most
		}
		return cost
	}
	n := float64(e.asked) * float64(leaseWindow) / float64(elapsed)
	if n >= float64(most) {
		return most
	}
	return max(1, int64(n+0.999999))
}

// renew asks the store for a lease of want more tokens for e, which is
// marked as renewing, and records the answer. It returns the store's error.
func (l *Limiter[K]) renew(ctx context.Context, e *lease, want int64) error {
	ls := l.leases
	id := newReservationID()
	start := time.Now()
	r, err := l.reserveRequest(e.enc, ls.ttl, []int64{want})
	var d Decision
	if err == nil {
		d, err = ls.res.Reserve(ctx, e.key, id, r, ls.ttl)
	}
	at := l.now()
	var back []leaseReturn
	e.mu.Lock()
	ch := e.renewing
	e.renewing = nil
	switch {
	case err != nil:
		if ctx.Err() == nil {
			e.outage = true
		}
	case d.Source != SourceStore:
		// An outage behaviour decided (a fallback's local bucket): no
		// lease from it; what it took goes back.
		e.outage = true
		if d.Allowed {
			back = e.handBack(grant{id: id, n: want}, back)
		}
	case d.Allowed:
		ls.taken.Add(1)
		g := grant{id: id, n: want, expires: at.Add(ls.lifetime)}
		if e.dead {
			back = e.handBack(g, back)
		} else {
			e.grants = append(e.grants, g)
			e.held += want
			e.size = e.held
		}
		e.last, e.lastAt, e.until = d, at, time.Time{}
	default:
		e.last, e.lastAt = d, at
		e.until = at.Add(d.RetryAfter)
	}
	e.mu.Unlock()
	if err != nil {
		l.failed(ctx, e.key, opReserve, want, err, start)
	}
	l.giveBack(back, nil)
	close(ch)
	return err
}

// take spends cost tokens of e's lease, oldest grant first, under e.mu.
func (e *lease) take(cost int64) {
	e.held -= cost
	for cost > 0 {
		g := &e.grants[0]
		k := min(cost, g.n-g.used)
		g.used += k
		cost -= k
		if g.used == g.n {
			e.drop(0)
		}
	}
}

// drop removes grant i from e's list.
func (e *lease) drop(i int) {
	copy(e.grants[i:], e.grants[i+1:])
	e.grants = e.grants[:len(e.grants)-1]
}

// expire removes, under e.mu, the grants whose lifetime is over, and hands
// them back (see handBack).
func (e *lease) expire(now time.Time, back []leaseReturn) []leaseReturn {
	for i := 0; i < len(e.grants); {
		if g := e.grants[i]; now.Before(g.expires) {
			i++
			continue
		}
		back = e.handBack(e.grants[i], back)
		e.held -= e.grants[i].n - e.grants[i].used
		e.drop(i)
	}
	return back
}

// handBack appends grant g of e to back, under e.mu, when it has unused
// tokens, and counts it as owed by e until its give-back ends.
func (e *lease) handBack(g grant, back []leaseReturn) []leaseReturn {
	if g.used >= g.n {
		return back
	}
	if e.owing++; e.returned == nil {
		e.returned = make(chan struct{})
	}
	return append(back, leaseReturn{e: e, g: g})
}

// rewind, under e.mu, brings e's times back to now when the clock has gone
// back since e's last check, by more than a lifetime: its grants then end
// within a lifetime of now, a denial's wait ends (the store decides the
// next check), and the rate is measured anew.
func (e *lease) rewind(ls *leases, now time.Time) {
	e.seen, e.since, e.lastAt, e.asked = now, now, now, 0
	if e.until.After(now) {
		e.until = time.Time{}
	}
	end := now.Add(ls.lifetime)
	for i := range e.grants {
		if e.grants[i].expires.After(end) {
			e.grants[i].expires = end
		}
	}
}

// bury marks e dead, under e.mu, and hands its grants back.
func (e *lease) bury(ls *leases, back []leaseReturn) []leaseReturn {
	e.dead = true
	for _, g := range e.grants {
		back = e.handBack(g, back)
	}
	e.grants, e.held = nil, 0
	ls.local.Add(e.local)
	ls.degraded.Add(e.degraded)
	e.local, e.degraded = 0, 0
	return back
}
