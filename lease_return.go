package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Close gives back the unused tokens of the limiter's leases, settling each
// in the store, and waits for the renewals and the give-backs in flight to
// end, or for ctx to end. It returns an error when some tokens could not be
// given back, saying how many, of how many leases: those are kept as taken
// (LeaseStats.Lost). When ctx ends first, the give-backs not made yet are
// abandoned, and those in flight cancelled. After Close, every check goes
// to the store. Closing a limiter without leases, or twice, does nothing.
func (l *Limiter[K]) Close(ctx context.Context) error {
	ls := l.leases
	if ls == nil || ls.closed.Swap(true) {
		return nil
	}
	var back []leaseReturn
	var flights []chan struct{}
	ls.mu.Lock()
	for enc, e := range ls.m {
		e.mu.Lock()
		back = e.bury(ls, back)
		if e.renewing != nil {
			flights = append(flights, e.renewing)
		}
		e.mu.Unlock()
		delete(ls.m, enc)
	}
	ls.mu.Unlock()
	c := new(closing)
	l.giveBack(back, c)
	for _, ch := range flights {
		select {
		case <-ch:
		case <-ctx.Done():
			return l.abandon(ctx, c)
		}
	}
	// A renewal that ended after its lease was buried has handed its
	// grant back: it is owed now.
	ls.rmu.Lock()
	drained := ls.drained
	ls.rmu.Unlock()
	if drained != nil {
		select {
		case <-drained:
		case <-ctx.Done():
			return l.abandon(ctx, c)
		}
	}
	ls.rmu.Lock()
	defer ls.rmu.Unlock()
	if c.leases > 0 {
		return fmt.Errorf("ratelimit: Close: %d unused tokens of %d leases not given back, kept as taken: %w", c.tokens, c.leases, c.err)
	}
	return nil
}

// closing counts the give-backs of a Close that failed.
type closing struct {
	tokens int64
	leases int
	err    error // the first failure
}

// abandon ends Close when ctx ended before the give-backs: those waiting
// are not made, those in flight are cancelled, and all count as lost. The
// error counts them with those of the Close that failed already.
func (l *Limiter[K]) abandon(ctx context.Context, c *closing) error {
	ls := l.leases
	ls.cancel()
	ls.rmu.Lock()
	tokens, leases := c.tokens+ls.owed, c.leases+ls.owing
	queued := ls.queue
	ls.queue = nil
	err := c.err
	ls.rmu.Unlock()
	for _, b := range queued {
		l.finish(b, ctx.Err())
	}
	return fmt.Errorf("ratelimit: Close: %d unused tokens of %d leases not given back, kept as taken: %w", tokens, leases, errors.Join(ctx.Err(), err))
}

// leaseReturn is a reservation to settle: the unused tokens of a grant of
// lease e.
type leaseReturn struct {
	e *lease
	g grant
	c *closing // the Close that gives it back, or nil
}

// giveBack hands the reservations of back to the returners: at most
// leaseReturners goroutines, which settle each with the tokens it used, in
// the background, within leaseReturnTimeout (see returner). A check never
// waits for a give-back but of its own subject (see acquireLeased). A
// give-back that leaseReturnQueue others wait ahead of is not made: its
// unused tokens are counted lost, kept as taken. c is the Close that gives
// back, or nil; its give-backs always wait.
func (l *Limiter[K]) giveBack(back []leaseReturn, c *closing) {
	if len(back) == 0 {
		return
	}
	ls := l.leases
	var over []leaseReturn
	ls.rmu.Lock()
	for _, b := range back {
		if ls.owing == 0 {
			ls.drained = make(chan struct{})
		}
		ls.owed += b.g.n - b.g.used
		ls.owing++
		if c == nil && len(ls.queue) >= leaseReturnQueue {
			over = append(over, b)
			continue
		}
		b.c = c
		ls.queue = append(ls.queue, b)
	}
	for ls.returners < min(leaseReturners, len(ls.queue)) {
		ls.returners++
		go l.returner()
	}
	ls.rmu.Unlock()
	for _, b := range over {
		l.finish(b, errReturnsQueued)
	}
}

// errReturnsQueued is the failure of a give-back not made because too many
// were waiting.
var errReturnsQueued = fmt.Errorf("ratelimit: over %d give-backs of leases waiting", leaseReturnQueue)

// returner settles the give-backs waiting, oldest first, each within
// leaseReturnTimeout, and ends when none is left.
func (l *Limiter[K]) returner() {
	ls := l.leases
	for {
		ls.rmu.Lock()
		if len(ls.queue) == 0 {
			ls.queue = nil
			ls.returners--
			ls.rmu.Unlock()
			return
		}
		b := ls.queue[0]
		ls.queue[0] = leaseReturn{}
		ls.queue = ls.queue[1:]
		ls.rmu.Unlock()
		ctx, cancel := context.WithTimeout(ls.stop, leaseReturnTimeout)
		_, err := l.settle(ctx, b.e.key, b.g.id, []int64{b.g.used})
		cancel()
		l.finish(b, err)
	}
}

// finish records the end of give-back b: made when err is nil, else its
// unused tokens are lost.
func (l *Limiter[K]) finish(b leaseReturn, err error) {
	ls := l.leases
	unused := b.g.n - b.g.used
	if err != nil {
		ls.lost.Add(unused)
	} else {
		ls.returned.Add(1)
	}
	e := b.e
	e.mu.Lock()
	if e.owing--; e.owing == 0 {
		close(e.returned)
		e.returned = nil
	}
	e.mu.Unlock()
	ls.rmu.Lock()
	ls.owed -= unused
	if ls.owing--; ls.owing == 0 {
		close(ls.drained)
		ls.drained = nil
	}
	if c := b.c; c != nil && err != nil {
		c.tokens += unused
		c.leases++
		if c.err == nil {
			c.err = err
		}
	}
	ls.rmu.Unlock()
}

// awaitReturns waits until ch is closed, at most leaseReturnTimeout; it
// returns ctx's error if ctx ends first.
func awaitReturns(ctx context.Context, ch <-chan struct{}) error {
	t := time.NewTimer(leaseReturnTimeout)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
