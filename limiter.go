package ratelimit

import (
	"context"
	"errors"
	"time"

	"github.com/exactlimit/ratelimit/internal/arith"
	"github.com/exactlimit/ratelimit/internal/clock"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/storehook"
)

// defaultNamespace is the namespace of a Limiter built without
// WithNamespace, and of the ratelimit command's service.
const defaultNamespace = "default"

// Limiter binds a policy, a namespace and a subject type to a Store. Each
// check decides and consumes atomically in the store; with redisstore that is
// one script call, so the limit holds across every process that shares the
// Redis. A Limiter is safe for simultaneous use by multiple goroutines.
type Limiter[K any] struct {
	store  Store
	limits []Limit
	quotas []Quota
	policy *policy // limits and quotas, validated: the proof its requests carry
	minCap int64   // the smallest capacity among limits and allowance among quotas
	ns     string
	prefix string
	encode func(K) string
	clock  func() time.Time
	split  storehook.SplitFunc[Request, Decision]     // store's, when it takes a key in two parts
	cache  *denyCache                                 // nil without WithDenyCache
	obs    Observer                                   // nil without WithObserver
	leases *leases                                    // nil without WithLeases
	sleep  func(context.Context, time.Duration) error // Wait's sleep
	jitter func(n int64) int64                        // Wait's jitter, in [0, n)
}

// Option configures a Limiter.
type Option func(*options)

type options struct {
	namespace string
	clock     func() time.Time
	denyCache int
	observer  Observer
	sleep     func(context.Context, time.Duration) error
	leases    time.Duration // the lifetime of WithLeases, 0 without
	quotas    []Quota
	// planRefresh is the interval of NewPlans's watcher (WithPlanRefresh).
	planRefresh time.Duration
	errs        []error
}

// WithNamespace sets the namespace that prefixes every key (default
// "default", the ratelimit command's default too, so a Limiter and the
// service share buckets unless told otherwise). Give each policy that is active at the same time its own
// namespace.
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithClock sets the clock the limiter reads the current time from: each
// check is then decided at clock() (the store is handed that time) instead
// of at the store's own time (for Redis, the server's TIME). Every package's
// WithClock means the same: the clock its component reads "now" from. Tests
// use it to control time on every store; in
// production the server's clock is usually the better choice, because every
// process then shares it.
//
// It controls the bucket arithmetic, not key expiry: Redis expires a key on
// its own clock (PX, in real time), and memstore on its own WithClock clock.
// With a clock that runs slower than real time, Redis may drop a bucket that
// by the injected clock is not yet full, and the next check finds it full:
// spend 2 of PerSecond(2), sleep 1.1 s, check at the same frozen instant, and
// memstore (built with the same clock) denies while Redis admits. A test that
// freezes or slows the injected clock against Redis must not also let real
// time pass beyond the buckets' ResetAfter.
func WithClock(clock func() time.Time) Option { return func(o *options) { o.clock = clock } }

// WithDenyCache keeps, in this process, the latest denial of up to size
// subjects (the least recently used go first: an LRU, sharded above 128
// entries), and denies their further
// checks locally, without asking the store, for as long as that denial proves
// the store would deny them too. Decisions it makes have Source SourceCache;
// Limiter.DenyCacheStats reports its size and hit rate. It is off by default.
//
// It is for subjects that keep trying while denied: their checks stop
// reaching Redis until the wait the store gave has passed, and cost no round
// trip. A denial of cost c with RetryAfter r denies, until r has passed,
// every cost of at least c, and a smaller cost c' only for as long as the
// binding limit takes to refill c - c' tokens less (so a cost the bucket held
// is never denied). RetryAfter counts down from the store's; Remaining is the
// balance the store reported with its denial. Peek always asks the store (its
// denials teach the cache too), and Reset drops the subject's entry.
//
// The cache never denies longer than the store's wait. With WithClock the
// cache and the store read the same clock, and the cache denies only what the
// store would deny at that moment. Without it, the store keeps its own clock (the Redis
// server's TIME) and the cache times each denial from time.Now read before
// the store is called, so it errs early by up to a round trip, never late,
// unless the server's clock jumps forward or runs faster than this host's
// during the wait, by that much. What the cache cannot see: a Reset by
// another process, a check under another policy (as in a rolling deploy) or
// a Redis that lost its data can make the shared bucket admit sooner; a
// subject then stays denied here for at most the rest of its last wait. A
// later admission by the store (of a smaller cost, or a peek) that
// contradicts the entry drops it. Only the store's own decisions are cached,
// not those of an outage behaviour. size must be at least 1.
func WithDenyCache(size int) Option {
	return func(o *options) {
		if size < 1 {
			o.errs = append(o.errs, invalid("deny cache size must be at least 1 (got %d)", size))
			return
		}
		o.denyCache = size
	}
}

// WithObserver makes the limiter tell each of obs, in turn, about every
// decision and every error, synchronously, on the checking goroutine (see
// Observer): metrics and a logger, say. Several WithObserver options add up.
// No observer may be nil.
func WithObserver(obs ...Observer) Option {
	return func(opts *options) {
		for _, o := range obs {
			if o == nil {
				opts.errs = append(opts.errs, invalid("observer must not be nil"))
				return
			}
			if opts.observer == nil {
				opts.observer = o
				continue
			}
			m, _ := opts.observer.(multiObserver)
			if m == nil {
				m = multiObserver{opts.observer}
			}
			opts.observer = append(m, o)
		}
	}
}

// New returns a Limiter that enforces limit on subjects of type K, a string
// type (string, or one of your own such as type UserID string): a subject's
// key is its namespace and the subject itself. It checks its arguments and
// does no I/O. The error wraps ErrInvalidArgument.
func New[K ~string](store Store, limit Limit, opts ...Option) (*Limiter[K], error) {
	return NewEncoded(store, encodeString[K], []Limit{limit}, opts...)
}

// NewMulti returns a Limiter whose policy combines several limits, decided as
// one: a check is admitted only when every limit holds the cost, and then
// takes it from all of them; a denial takes from none. "5 per minute and 100
// per day" is NewMulti(store, []Limit{PerMinute(5), PerDay(100)}). The
// bucket is still one key and one atomic step per check.
func NewMulti[K ~string](store Store, limits []Limit, opts ...Option) (*Limiter[K], error) {
	return NewEncoded(store, encodeString[K], limits, opts...)
}

// NewEncoded returns a Limiter of limits on subjects of any type K, whose
// keys are encode(subject): strconv.FormatInt for an integer ID, say, or a
// struct's fields joined. Two subjects share a bucket exactly when they
// encode to the same string, and a subject that encodes to "" is refused.
// encode must be quick, and safe for simultaneous use.
func NewEncoded[K any](store Store, encode func(K) string, limits []Limit, opts ...Option) (*Limiter[K], error) {
	if store == nil {
		return nil, invalid("store must not be nil")
	}
	if encode == nil {
		return nil, invalid("encode must not be nil")
	}
	o := options{namespace: defaultNamespace, sleep: clock.Sleep}
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.errs) > 0 {
		return nil, errors.Join(o.errs...)
	}
	if err := validatePolicy(limits, o.quotas); err != nil {
		return nil, err
	}
	if o.namespace == "" {
		return nil, invalid("namespace must not be empty")
	}
	l := &Limiter[K]{
		store:  store,
		limits: append([]Limit(nil), limits...),
		quotas: append([]Quota(nil), o.quotas...),
		policy: &policy{limits: append([]Limit(nil), limits...), quotas: append([]Quota(nil), o.quotas...)},
		ns:     o.namespace,
		prefix: keyfmt.Prefix(o.namespace),
		encode: encode,
		clock:  o.clock,
		obs:    o.observer,
		sleep:  o.sleep,
		jitter: randJitter,
	}
	l.minCap = limits[0].Capacity
	for _, lim := range limits {
		l.minCap = min(l.minCap, lim.Capacity)
	}
	for _, q := range o.quotas {
		l.minCap = min(l.minCap, q.Allowance)
	}
	if len(l.quotas) == 0 {
		l.quotas = nil
		l.policy.quotas = nil
	}
	l.split = storehook.Split[Request, Decision](store)
	if o.denyCache > 0 {
		l.cache = newDenyCache(o.denyCache)
	}
	if o.leases > 0 {
		var err error
		if l.leases, err = newLeases(store, o.leases, l.minCap); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// encodeString is the key of a subject of a string type: the subject.
func encodeString[K ~string](k K) string { return string(k) }

// TryAcquire takes one token for subject if its bucket holds one. It never
// waits: a denied Decision says how long to wait before trying again.
func (l *Limiter[K]) TryAcquire(ctx context.Context, subject K) (Decision, error) {
	return l.TryAcquireN(ctx, subject, 1)
}

// TryAcquireN takes cost tokens for subject if its bucket holds them, and
// takes nothing otherwise. cost must be between 1 and the capacity; an
// invalid cost or subject is an error wrapping ErrInvalidArgument, returned
// before the store is called.
func (l *Limiter[K]) TryAcquireN(ctx context.Context, subject K, cost int64) (Decision, error) {
	if l.leases != nil {
		return l.acquireLeased(ctx, subject, cost)
	}
	if l.split != nil && l.cache == nil && l.obs == nil {
		// The store takes the key in two parts: no key is built.
		var now time.Time
		if l.clock != nil {
			now = l.clock()
		}
		var r Request
		enc, err := l.subjectRequest(&r, subject, cost, false, now)
		if err != nil {
			return Decision{}, err
		}
		return l.split(ctx, l.prefix, enc, r)
	}
	key, r, err := l.Request(subject, cost)
	if err != nil {
		l.failed(ctx, l.errKey(subject), opAcquire, cost, err, time.Time{})
		return Decision{}, err
	}
	return l.apply(ctx, key, r)
}

// Peek reports subject's standing without consuming: Allowed while at least
// one token is there, else Denied with the wait until one is. The bucket is
// refilled by the time elapsed, but nothing is taken.
//
// Peek never consults the denial cache (WithDenyCache): it always asks the
// store, and the cache learns from its answer.
func (l *Limiter[K]) Peek(ctx context.Context, subject K) (Decision, error) {
	key, r, err := l.request(subject, 1, true)
	if err != nil {
		l.failed(ctx, l.errKey(subject), opPeek, 1, err, time.Time{})
		return Decision{}, err
	}
	return l.apply(ctx, key, r)
}

// Reset deletes subject's bucket, so that its next check starts full, and
// drops the subject's entry from the denial cache, even when the store
// failed.
func (l *Limiter[K]) Reset(ctx context.Context, subject K) error {
	enc := l.encode(subject)
	if enc == "" {
		err := invalid("subject must not be empty")
		l.failed(ctx, "", opReset, 0, err, time.Time{})
		return err
	}
	key := l.prefix + enc
	if l.cache == nil && l.obs == nil {
		return l.store.Reset(ctx, key)
	}
	start := time.Now()
	err := l.store.Reset(ctx, key)
	if l.cache != nil {
		l.cache.forget(key)
	}
	if err != nil {
		l.failed(ctx, key, opReset, 0, err, start)
	}
	return err
}

// apply decides r for key: from the denial cache when it can, else through
// the store, telling the observer either way.
func (l *Limiter[K]) apply(ctx context.Context, key string, r Request) (Decision, error) {
	if l.cache == nil && l.obs == nil {
		return l.store.Apply(ctx, key, r)
	}
	start := time.Now()
	at := r.Now
	if at.IsZero() {
		at = start
	}
	cost := r.Cost
	if r.Peek {
		cost = 1
	}
	op := opAcquire
	if r.Peek {
		op = opPeek
	}
	var present bool
	var resets uint64
	if l.cache != nil {
		if !r.Peek {
			var d Decision
			var hit bool
			if d, hit, present = l.cache.lookup(key, cost, at); hit {
				l.decided(ctx, key, cost, r.Peek, d, start)
				return d, nil
			}
		}
		resets = l.cache.resets.Load()
	}
	d, err := l.store.Apply(ctx, key, r)
	if err != nil {
		l.failed(ctx, key, op, cost, err, start)
		return d, err
	}
	if l.cache != nil && (!d.Allowed || present || r.Peek) {
		l.cache.record(key, cost, r.Peek, d, at, resets)
	}
	l.decided(ctx, key, cost, r.Peek, d, start)
	return d, nil
}

// decided tells the observer about a decision.
func (l *Limiter[K]) decided(ctx context.Context, key string, cost int64, peek bool, d Decision, start time.Time) {
	if l.obs != nil {
		l.obs.ObserveDecision(ctx, DecisionEvent{Namespace: l.ns, Key: key, Cost: cost, Peek: peek, Decision: d, Latency: time.Since(start)})
	}
}

// errKey returns the key an ErrorEvent reports for a check on subject that
// was refused before the store: the subject's key when the subject itself is
// valid (the cost or the clock's time was not), else "". It encodes only
// when there is an observer to tell.
func (l *Limiter[K]) errKey(subject K) string {
	if l.obs == nil {
		return ""
	}
	enc := l.encode(subject)
	if enc == "" {
		return ""
	}
	return l.prefix + enc
}

// failed tells the observer about an error. A zero start (an argument
// refused before any work) reports no latency.
func (l *Limiter[K]) failed(ctx context.Context, key string, op string, cost int64, err error, start time.Time) {
	if l.obs == nil {
		return
	}
	var latency time.Duration
	if !start.IsZero() {
		latency = time.Since(start)
	}
	l.obs.ObserveError(ctx, ErrorEvent{Namespace: l.ns, Key: key, Op: op, Cost: cost, Err: err, Latency: latency})
}

// DenyCacheStats returns a snapshot of the denial cache's size and counts;
// the zero CacheStats when the limiter has no cache (see WithDenyCache).
func (l *Limiter[K]) DenyCacheStats() CacheStats {
	if l.cache == nil {
		return CacheStats{}
	}
	return l.cache.stats()
}

// Key returns the store key that holds subject's bucket:
// "<len(namespace)>:<namespace>:<encoded subject>". The length frame keeps
// namespace "a" with subject "b:c" apart from namespace "a:b" with subject
// "c".
func (l *Limiter[K]) Key(subject K) string { return l.prefix + l.encode(subject) }

// Request returns the key and the validated Request of a check of cost
// tokens for subject, for running the check yourself: for example on a Redis
// pipeline with redisstore's Queue. The error wraps ErrInvalidArgument.
func (l *Limiter[K]) Request(subject K, cost int64) (key string, r Request, err error) {
	return l.request(subject, cost, false)
}

func (l *Limiter[K]) request(subject K, cost int64, peek bool) (string, Request, error) {
	var now time.Time
	if l.clock != nil {
		now = l.clock()
	}
	return l.requestAt(subject, cost, peek, now)
}

// requestAt is request with the time of the check already read (the zero
// Time without WithClock).
func (l *Limiter[K]) requestAt(subject K, cost int64, peek bool, now time.Time) (string, Request, error) {
	var r Request
	enc, err := l.subjectRequest(&r, subject, cost, peek, now)
	if err != nil {
		return "", Request{}, err
	}
	return l.prefix + enc, r, nil
}

// subjectRequest validates a check, fills in *r (which must be the zero
// Request; filled in place, it is not copied on return) and returns the
// encoded subject, the key without its prefix.
func (l *Limiter[K]) subjectRequest(r *Request, subject K, cost int64, peek bool, now time.Time) (string, error) {
	if !peek && (cost < 1 || cost > l.minCap) {
		return "", validateCost(l.limits, l.quotas, cost)
	}
	enc := l.encode(subject)
	if enc == "" {
		return "", invalid("subject must not be empty")
	}
	r.Limits, r.Quotas, r.Cost, r.Peek, r.policy = l.limits, l.quotas, cost, peek, l.policy
	if l.clock != nil {
		r.Now = now
		if _, rule := arith.Micros(r.Now); rule != "" {
			return "", invalid("%s", rule)
		}
	}
	return enc, nil
}

// Limits returns the limiter's policy: the Limit it was built with, or the
// Limits of NewMulti. It returns a copy: changing it does not change the
// policy.
func (l *Limiter[K]) Limits() []Limit { return append([]Limit(nil), l.limits...) }

// Quotas returns the quotas of the limiter's policy (see WithQuotas), nil
// when it has none. It returns a copy.
func (l *Limiter[K]) Quotas() []Quota { return append([]Quota(nil), l.quotas...) }

// Namespace returns the namespace that prefixes the limiter's keys.
func (l *Limiter[K]) Namespace() string { return l.ns }

// Store returns the store the limiter decides through.
func (l *Limiter[K]) Store() Store { return l.store }
