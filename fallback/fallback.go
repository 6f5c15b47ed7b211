package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/clock"
	"github.com/exactlimit/ratelimit/internal/storehook"
	"github.com/exactlimit/ratelimit/memstore"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

// DefaultProbeInterval is ProbeForever's interval when it is given none.
const DefaultProbeInterval = 100 * time.Millisecond

// probeKey is the key the default probe peeks at. It has no length frame, so
// it is never the key of a Limiter's subject.
const probeKey = "fallback:probe"

// probeLimits is the policy of the default probe's peek.
var probeLimits = []ratelimit.Limit{{Capacity: 1, RefillTokens: 1, RefillPeriod: time.Second}}

// Store wraps a primary ratelimit.Store with an outage behaviour, a breaker
// and a liveness probe. The zero Store is not usable; call New. A Store is
// safe for simultaneous use by multiple goroutines.
type Store struct {
	config  // the options, as New completed them
	primary ratelimit.Store
	split   splitFunc // primary's, when it takes a key in two parts
	local   *memstore.Store
	// localSplit is local's applySplit.
	localSplit splitFunc

	single   *part    // the one flag, when the primary is one partition
	parts    sync.Map // partition name -> *part, when it reports partitions
	probing  atomic.Int32
	interval atomic.Int64 // ProbeForever's interval, for kick

	storeHooks // applySplit, for the Limiter
}

// storeHooks is what a Store offers the Limiter and no user calls (see
// package storehook).
type storeHooks = storehook.Hooks[ratelimit.Request, ratelimit.Decision]

// splitFunc is a store's Apply on a key in two parts (see
// storehook.OfferSplit).
type splitFunc = storehook.SplitFunc[ratelimit.Request, ratelimit.Decision]

// New returns a Store that decides through primary while it answers, and
// with the outage behaviour of the options while it does not. The primary is
// assumed alive until a call fails. New does no I/O. The error wraps
// ratelimit.ErrInvalidArgument.
func New(primary ratelimit.Store, opts ...Option) (*Store, error) {
	if primary == nil {
		return nil, fmt.Errorf("%w: fallback: primary store must not be nil", ratelimit.ErrInvalidArgument)
	}
	c := config{outage: ReturnError, share: 1, clock: monotonicClock(), classify: IsUnreachable}
	for _, o := range opts {
		o(&c)
	}
	if len(c.errs) > 0 {
		return nil, errors.Join(c.errs...)
	}
	s := &Store{
		config:  c,
		primary: primary,
		local:   memstore.New(memstore.WithClock(c.clock)),
		single:  &part{},
	}
	storehook.OfferSplit(&s.storeHooks, s.applySplit)
	s.localSplit = storehook.Split[ratelimit.Request, ratelimit.Decision](s.local)
	s.split = storehook.Split[ratelimit.Request, ratelimit.Decision](primary)
	if s.partOf == nil {
		if partition, ping := storehook.Partitions[ratelimit.Request, ratelimit.Decision](primary); partition != nil && ping != nil {
			s.partOf, s.pingPart = partition, ping
		}
	}
	if s.ping == nil {
		if p, ok := primary.(ratelimit.Pinger); ok {
			s.ping = p.Ping
		} else {
			s.ping = s.peekPrimary
		}
	}
	return s, nil
}

// Apply decides r against the bucket at key: through the primary while it is
// alive, else with the outage behaviour, at once. A call whose primary fails
// with an unreachable error marks it down and is itself answered by the
// outage behaviour. An invalid request is an error wrapping
// ratelimit.ErrInvalidArgument, and a done ctx returns ctx.Err(), both
// before anything is asked; neither marks the primary down.
func (s *Store) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	return s.apply(ctx, "", key, r)
}

// applySplit is Apply on the key prefix+subject, which a Limiter calls
// instead of building the key (the Store offers it with
// storehook.OfferSplit). The parts are joined only to ask a primary that
// does not take them apart itself (a redisstore.Store, which needs the whole
// key for Redis anyway), and, over a partitioned primary, before the
// partition function is called; the local buckets of LocalFallback take
// them apart. Over a memstore.Store, one partition, a check allocates no key,
// whether the primary or the local bucket decides it.
func (s *Store) applySplit(ctx context.Context, prefix, subject string, r ratelimit.Request) (ratelimit.Decision, error) {
	return s.apply(ctx, prefix, subject, r)
}

// apply is Apply on the key prefix+key.
func (s *Store) apply(ctx context.Context, prefix, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := r.Validate(); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	if prefix != "" && s.partOf != nil {
		prefix, key = "", prefix+key
	}
	p := s.partition(ctx, key)
	gen := p.gen.Load()
	if gen&1 != 0 {
		return s.serve(ctx, prefix, key, r, p, nil)
	}
	d, err := s.callPrimary(ctx, prefix, key, r)
	if err == nil {
		p.answered.Add(1)
		return d, nil
	}
	switch s.failure(ctx, p, err) {
	case callerGaveUp:
		return ratelimit.Decision{}, err
	case notOutage:
		return ratelimit.Decision{}, err
	case callerDeadline:
		// Answered by the outage behaviour, which does not block, but the
		// breaker stays closed: one impatient caller is not an outage.
		return s.serve(ctx, prefix, key, r, p, err)
	}
	s.down(ctx, p, gen, err)
	return s.serve(ctx, prefix, key, r, p, err)
}

// Reset deletes the bucket at key in the primary and in this process. While
// the primary is down, or when it cannot be reached, only the local bucket
// is deleted and the error wraps ratelimit.ErrUnavailable, whatever the outage
// behaviour: the shared bucket was not reset.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_ = s.local.Reset(context.WithoutCancel(ctx), key)
	_, cause, err := s.guard(ctx, key, func(ctx context.Context) (ratelimit.Decision, error) {
		return ratelimit.Decision{}, s.primary.Reset(ctx, key)
	})
	if cause != nil {
		return s.unavailable(ctx, key, err)
	}
	return err
}

// Outage returns the behaviour the Store applies while the primary is down.
func (s *Store) Outage() Outage { return s.outage }

// FleetShare returns n of WithFleetShare (1 when not set).
func (s *Store) FleetShare() int { return int(s.share) }

// Primary returns the wrapped store.
func (s *Store) Primary() ratelimit.Store { return s.primary }

// Local returns the store of the process-local buckets that LocalFallback
// decides with, so that a caller can inspect them. Its buckets hold the
// share's limits, not the policy's.
func (s *Store) Local() *memstore.Store { return s.local }

// callPrimary asks the primary to decide r on the key prefix+key, joining
// the two only for a primary that does not take them apart.
func (s *Store) callPrimary(ctx context.Context, prefix, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	ctx, cancel := s.withTimeout(ctx)
	defer cancel()
	switch {
	case prefix == "":
		return s.primary.Apply(ctx, key, r)
	case s.split != nil:
		return s.split(ctx, prefix, key, r)
	}
	return s.primary.Apply(ctx, prefix+key, r)
}

// withTimeout bounds a call of the primary by the store's timeout (see
// WithTimeout); a caller whose deadline comes first keeps it alone.
func (s *Store) withTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return clock.Bound(ctx, s.timeout)
}

// A failure is what an error of the primary means for the breaker.
type failure int

const (
	// outage: the primary could not be reached (see IsUnreachable, or
	// WithClassifier); it is marked down.
	outage failure = iota
	// notOutage: the primary answered, with an error that would be the same
	// again (an invalid argument, a corrupt bucket, a script error).
	notOutage
	// callerGaveUp: the caller cancelled its context.
	callerGaveUp
	// callerDeadline: the caller's own deadline ran out while the primary
	// was slow.
	callerDeadline
)

// failure classifies err, returned by the primary for a call made with ctx
// on partition p. The caller's own deadline or cancellation never opens the
// breaker: a slow answer is not an outage. A call whose caller's deadline ran
// out kicks a probe of p (see kick) instead, so that a hung primary is still
// found within the caller's deadline plus one probe interval. WithTimeout's
// deadline, which ran out while the caller's had not, is an outage.
func (s *Store) failure(ctx context.Context, p *part, err error) failure {
	switch cerr := ctx.Err(); {
	case errors.Is(cerr, context.Canceled):
		return callerGaveUp
	case cerr != nil || pastDeadline(ctx):
		s.kick(ctx, p)
		return callerDeadline
	case s.classify(err):
		return outage
	}
	return notOutage
}

// pastDeadline reports whether ctx's deadline has passed: a connection's
// read deadline, set from it, can fire before the context's own timer does.
func pastDeadline(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// serve answers a check on the key prefix+key with the outage behaviour.
// cause is the error of this call when it is the one that found the primary
// down.
func (s *Store) serve(ctx context.Context, prefix, key string, r ratelimit.Request, p *part, cause error) (ratelimit.Decision, error) {
	switch s.outage {
	case FailOpen:
		return s.unchecked(r, true)
	case FailClosed:
		return s.unchecked(r, false)
	case LocalFallback:
		return s.applyLocal(ctx, prefix, key, r)
	}
	if cause != nil {
		return ratelimit.Decision{}, wrapUnavailable(cause)
	}
	return ratelimit.Decision{}, p.unavailable()
}

// monotonicClock returns a clock that reads the wall clock once, now, and
// then advances it by the monotonic clock (memstore's default).
func monotonicClock() func() time.Time {
	start := time.Now()
	return func() time.Time { return start.Add(time.Since(start)) }
}

// now returns the time of r in microseconds: its own, else the clock's.
func (s *Store) now(r ratelimit.Request) (int64, error) {
	t := r.Now
	if t.IsZero() {
		t = s.clock()
	}
	return tokenbucket.Micros(t)
}

// unchecked returns the decision of a full bucket (open) or an empty one,
// made with tokenbucket's State.Step so that its fields follow the policy.
func (s *Store) unchecked(r ratelimit.Request, open bool) (ratelimit.Decision, error) {
	us, err := s.now(r)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	var st tokenbucket.State
	src := ratelimit.SourceFailOpen
	if !open {
		st = emptyState(r.Limits, us)
		src = ratelimit.SourceFailClosed
	}
	d, _, _ := st.Step(r, us)
	d.Source = src
	return d, nil
}

// emptyState returns a bucket that holds no token at now.
func emptyState(limits []ratelimit.Limit, now int64) tokenbucket.State {
	st := tokenbucket.State{Last: now, Bands: make([]tokenbucket.Band, len(limits))}
	for i, l := range limits {
		st.Bands[i] = tokenbucket.Band{Limit: l}
	}
	return st
}

// applyLocal decides r against the local bucket at prefix+key, under the
// share.
func (s *Store) applyLocal(ctx context.Context, prefix, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	lr := s.shared(r)
	if d, denied, err := s.beyondShare(r, lr); denied || err != nil {
		return d, err
	}
	return s.onLocal(ctx, lr, func(ctx context.Context, lr ratelimit.Request) (ratelimit.Decision, error) {
		if prefix != "" {
			return s.localSplit(ctx, prefix, key, lr)
		}
		return s.local.Apply(ctx, key, lr)
	})
}

// onLocal runs call on the local buckets with lr, a request under the share,
// at the Store's clock when lr has no time, and marks its decision
// SourceLocal. The call that found the primary down may have spent the
// caller's deadline on it; a local call does not block, so it is still made.
// (Only then is ctx replaced: WithoutCancel allocates.)
func (s *Store) onLocal(ctx context.Context, lr ratelimit.Request, call func(ctx context.Context, lr ratelimit.Request) (ratelimit.Decision, error)) (ratelimit.Decision, error) {
	if lr.Now.IsZero() {
		lr.Now = s.clock()
	}
	if ctx.Err() != nil {
		ctx = context.WithoutCancel(ctx)
	}
	d, err := call(ctx, lr)
	if err != nil {
		return d, err
	}
	d.Source = ratelimit.SourceLocal
	return d, nil
}

// peekPrimary is the default probe: a peek at probeKey, which writes nothing
// when the bucket is missing.
func (s *Store) peekPrimary(ctx context.Context) error {
	_, err := s.primary.Apply(ctx, probeKey, ratelimit.Request{Limits: probeLimits, Peek: true})
	return err
}
