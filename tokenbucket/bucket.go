package tokenbucket

import (
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
)

// Bucket is a token bucket kept in this process, with the same exact
// arithmetic as every Store (it decides with Step). Every decision is a
// function of the bucket's state and the time passed in, so it is testable
// without a real clock. It starts full.
//
// The bucket is local: N processes each holding one admit N times the rate. A
// fleet should share a bucket through redisstore. A Bucket is safe for
// simultaneous use by multiple goroutines.
type Bucket struct {
	mu     sync.Mutex
	limits []ratelimit.Limit
	st     State
}

// New returns a full bucket enforcing limit, and every one of more
// as well: with several limits a request is admitted only when each holds
// its cost, and takes it from all of them (see ratelimit.NewMulti). The error wraps
// ratelimit.ErrInvalidArgument when a limit is invalid.
func New(limit ratelimit.Limit, more ...ratelimit.Limit) (*Bucket, error) {
	limits := append([]ratelimit.Limit{limit}, more...)
	if err := (ratelimit.Request{Limits: limits, Peek: true}).Validate(); err != nil {
		return nil, err
	}
	b := &Bucket{limits: limits}
	b.st.Bands = make([]Band, 0, len(limits))
	return b, nil
}

// Allow reports whether one token could be taken at now, and takes it if so.
// It is AllowN(now, 1): see there for the false it returns on invalid input.
func (b *Bucket) Allow(now time.Time) bool { return b.AllowN(now, 1) }

// AllowN reports whether n tokens could be taken at now, and takes them if
// so. It returns false, taking nothing, when fewer than n tokens are there,
// and also, taking nothing, when n is outside 1..capacity or now is out of
// range. The zero time.Time is out of range: Allow(time.Time{}) is a
// programming error (an unset time), reported as false. Take decides the same
// and returns the error that says which argument was wrong; use it where a
// bad argument must not pass for a denial.
func (b *Bucket) AllowN(now time.Time, n int64) bool {
	d, err := b.Take(now, n)
	return err == nil && d.Allowed
}

// Available returns the whole tokens in the bucket at now. The bucket is
// refilled by the time elapsed; nothing is taken. It returns 0 when now is out
// of range, the zero time.Time included (Peek returns the error).
func (b *Bucket) Available(now time.Time) int64 {
	d, err := b.Peek(now)
	if err != nil {
		return 0
	}
	return d.Remaining
}

// Take takes n tokens at now if the bucket holds them, and returns the
// Decision. The error wraps ErrInvalidArgument when n is outside 1..capacity
// or now is before the Unix epoch or too far after it; for the zero time.Time
// it says so (a programming error: the time was never set).
func (b *Bucket) Take(now time.Time, n int64) (ratelimit.Decision, error) {
	return b.apply(ratelimit.Request{Limits: b.limits, Cost: n, Now: now})
}

// Peek reports the bucket's standing at now without taking anything: Allowed
// while at least one token is there, else Denied with the wait until one is.
// The error wraps ErrInvalidArgument when now is out of range, as for Take.
func (b *Bucket) Peek(now time.Time) (ratelimit.Decision, error) {
	return b.apply(ratelimit.Request{Limits: b.limits, Peek: true, Now: now})
}

// Limits returns the bucket's limits. It returns a copy: changing it does not
// change the bucket.
func (b *Bucket) Limits() []ratelimit.Limit { return append([]ratelimit.Limit(nil), b.limits...) }

func (b *Bucket) apply(r ratelimit.Request) (ratelimit.Decision, error) {
	if err := r.Validate(); err != nil {
		return ratelimit.Decision{}, err
	}
	us, err := Micros(r.Now)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	b.mu.Lock()
	d, _, _ := b.st.Step(r, us)
	b.mu.Unlock()
	return d, nil
}
