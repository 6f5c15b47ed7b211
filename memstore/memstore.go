// Package memstore is a ratelimit.Store that keeps token buckets in this
// process: for a single instance, for tests, and as the local bucket of
// package fallback.
//
// It decides with ratelimit's Step, the same exact arithmetic as the Redis
// script, so a Limiter gives the same Decisions on either store. Buckets are
// spread over shards, each behind its own mutex; a bucket takes a few dozen
// bytes besides its subject, while a Limiter's key prefix (its namespace) and
// the policies that wrote the buckets are kept once. A bucket is dropped once it would be full again on the store's clock
// (as a Redis key expires on the server's): each shard sweeps out such
// buckets after as many checks as it holds buckets, and sweeps a part of
// another shard at the same time, so memory follows the subjects active
// within one refill window at a constant amortized cost per check. The store
// starts no goroutine.
//
// A Store is safe for simultaneous use by multiple goroutines.
package memstore

import (
	"context"
	"hash/maphash"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
)

const shardCount = 64

// Store keeps token buckets in memory. The zero Store is not usable; call New.
type Store struct {
	seed   maphash.Seed
	clock  func() time.Time // nil: start's monotonic clock
	start  time.Time        // the store's creation, with a monotonic reading
	base   int64            // µs on the store's clock at start; expiry seconds count from it
	cursor atomic.Uint32    // the next shard a sweep visits besides its own

	polMu    sync.Mutex
	policies atomic.Pointer[[]*policy] // copy on write; a policy's index never changes

	shards [shardCount]shard
}

// policy is a validated policy, kept once per store and shared by the
// buckets it wrote.
type policy struct {
	limits []ratelimit.Limit
	minCap int64
	index  uint32
}

type shard struct {
	mu     sync.Mutex
	spaces map[string]*space // by key prefix
	last   *space            // the space of the latest check
	n      int               // buckets in all spaces
	ops    int
	_      [24]byte // keep shards on separate cache lines
}

// space holds a shard's buckets of one key prefix (a Limiter's namespace),
// keyed by the rest of the key: the prefix is kept once, not per bucket.
type space struct {
	prefix  string
	buckets map[string]*entry
	// extra holds the levels of the second and later limits of buckets
	// written by a policy of several limits.
	extra map[string]*[ratelimit.MaxLimits - 1]int64
}

// entry is one bucket: 24 bytes, and 8 in the map beside its subject.
type entry struct {
	last    int64  // µs, the State's Last
	level   int64  // the first limit's level
	pol     uint32 // the index of the policy that wrote the bucket
	expires uint32 // whole seconds after base, rounded up, on the store's clock
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the store's own clock. It decides the requests that carry
// no time (the zero Request.Now), and it times the expiry of every bucket, as
// the server's clock does for Redis keys. The default is the wall clock read
// at New advanced by the monotonic clock, so that a step of the system clock
// neither credits nor withholds refill.
func WithClock(clock func() time.Time) Option { return func(s *Store) { s.clock = clock } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), start: time.Now()}
	for _, o := range opts {
		o(s)
	}
	s.base = s.start.UnixMicro()
	if s.clock != nil {
		s.base = s.clock().UnixMicro()
	}
	s.policies.Store(new([]*policy))
	for i := range s.shards {
		s.shards[i].spaces = make(map[string]*space)
	}
	return s
}

// Apply decides r against the bucket at key and updates it, atomically with
// respect to every other call on the same key. It honours ctx only in that a
// cancelled context is an error: the decision itself never blocks. The store
// keeps a copy of key, never key itself.
func (s *Store) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	prefix, subject := split(key)
	return s.apply(ctx, prefix, subject, r)
}

// ApplySplit is Apply on the key prefix+subject, without joining them: the
// store keeps prefix once for all its buckets. Limiter uses it (see
// ratelimit.SplitKeyStore).
func (s *Store) ApplySplit(ctx context.Context, prefix, subject string, r ratelimit.Request) (ratelimit.Decision, error) {
	if p, rest := split(prefix); p != prefix || rest != "" {
		// Not a Limiter's length-framed prefix: file the key as Apply would.
		return s.Apply(ctx, prefix+subject, r)
	}
	return s.apply(ctx, prefix, subject, r)
}

// split cuts a Limiter's key, "<len(ns)>:<ns>:<subject>", after its prefix.
// Any other key is all subject, with the empty prefix.
func split(key string) (prefix, subject string) {
	i := 0
	n := 0
	for i < len(key) && i < 10 && key[i] >= '0' && key[i] <= '9' {
		n = n*10 + int(key[i]-'0')
		i++
	}
	if i == 0 || i >= len(key) || key[i] != ':' {
		return "", key
	}
	end := i + 1 + n
	if end >= len(key) || key[end] != ':' {
		return "", key
	}
	return key[:end+1], key[end+1:]
}

// apply decides r on the bucket at prefix+subject.
func (s *Store) apply(ctx context.Context, prefix, subject string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	p := s.policyFor(r.Limits)
	if p == nil || !r.Peek && (r.Cost < 1 || r.Cost > p.minCap) {
		return ratelimit.Decision{}, r.Validate()
	}
	// Buckets expire on the store's own clock, as Redis keys expire on the
	// server's, whatever time the request carries.
	clock := s.now()
	us := clock
	if !r.Now.IsZero() {
		us = r.Now.UnixMicro()
	}
	if us < 0 || us > ratelimit.MaxExact {
		_, err := ratelimit.Micros(time.UnixMicro(us))
		return ratelimit.Decision{}, err
	}
	n := len(p.limits)
	var bands [ratelimit.MaxLimits]ratelimit.Band
	st := ratelimit.State{Bands: bands[:0]}

	sh := &s.shards[maphash.String(s.seed, subject)%shardCount]
	sh.mu.Lock()
	swept := sh.sweep(s.seconds(clock))
	sp := sh.space(prefix)
	e := sp.buckets[subject]
	found := e != nil
	var old *policy
	if found {
		old = s.policy(e.pol)
		m := len(old.limits)
		st.Last, st.Bands = e.last, bands[:m]
		bands[0] = ratelimit.Band{Limit: old.limits[0], Level: e.level}
		if m > 1 {
			more := sp.extra[subject]
			for i := 1; i < m; i++ {
				bands[i] = ratelimit.Band{Limit: old.limits[i], Level: more[i-1]}
			}
		}
	}
	d, ttl, write := st.Step(r, us)
	if write {
		if found && len(old.limits) > 1 && n == 1 {
			delete(sp.extra, subject)
		}
		if n > 1 {
			more := sp.extra[subject]
			if more == nil {
				more = new([ratelimit.MaxLimits - 1]int64)
				sp.extra[strings.Clone(subject)] = more
			}
			for i := 1; i < n; i++ {
				more[i-1] = st.Bands[i].Level
			}
		}
		if !found {
			e = new(entry)
			sp.buckets[strings.Clone(subject)] = e
			sh.n++
		}
		*e = entry{last: st.Last, level: st.Bands[0].Level, pol: p.index, expires: s.expiry(clock, ttl)}
	}
	sh.mu.Unlock()
	if swept {
		// Shards that see no checks are swept by the others, a bounded
		// number of buckets at a time.
		other := &s.shards[s.cursor.Add(1)%shardCount]
		other.mu.Lock()
		other.sweepSome(s.seconds(clock), 256)
		other.mu.Unlock()
	}
	return d, nil
}

// policyFor returns the store's copy of limits, or nil when they are not a
// valid policy.
func (s *Store) policyFor(limits []ratelimit.Limit) *policy {
	if p := findPolicy(*s.policies.Load(), limits); p != nil {
		return p
	}
	if (ratelimit.Request{Limits: limits, Peek: true}).Validate() != nil {
		return nil
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	old := *s.policies.Load()
	if p := findPolicy(old, limits); p != nil {
		return p
	}
	p := &policy{limits: slices.Clone(limits), minCap: math.MaxInt64, index: uint32(len(old))}
	for _, l := range limits {
		p.minCap = min(p.minCap, l.Capacity)
	}
	next := append(slices.Clip(old), p)
	s.policies.Store(&next)
	return p
}

// findPolicy looks for limits among policies, the most recent first, so that
// a rolling deploy's new policy is found at once.
func findPolicy(policies []*policy, limits []ratelimit.Limit) *policy {
	for i := len(policies) - 1; i >= 0; i-- {
		if slices.Equal(policies[i].limits, limits) {
			return policies[i]
		}
	}
	return nil
}

// policy returns the policy of index i.
func (s *Store) policy(i uint32) *policy { return (*s.policies.Load())[i] }

// now returns the store's clock in µs since the Unix epoch.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock().UnixMicro()
	}
	return s.base + int64(time.Since(s.start)/time.Microsecond)
}

// seconds returns the whole seconds from base to clock (µs), rounded down.
func (s *Store) seconds(clock int64) uint32 {
	d := (clock - s.base) / 1e6
	return uint32(min(max(d, 0), math.MaxUint32))
}

// expiry returns the second after base at which a bucket written at clock
// with ttl is full: rounded up, so it is never dropped early.
func (s *Store) expiry(clock int64, ttl time.Duration) uint32 {
	at := clock - s.base + ttl.Microseconds()
	sec := (at + 1e6 - 1) / 1e6
	return uint32(min(max(sec, 0), math.MaxUint32))
}

// Reset deletes the bucket at key, so that its next check starts full.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prefix, subject := split(key)
	sh := &s.shards[maphash.String(s.seed, subject)%shardCount]
	sh.mu.Lock()
	if sp := sh.spaces[prefix]; sp != nil {
		if _, ok := sp.buckets[subject]; ok {
			delete(sp.buckets, subject)
			delete(sp.extra, subject)
			sh.n--
		}
	}
	sh.mu.Unlock()
	return nil
}

// Len returns the number of buckets held: those not yet swept out.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every bucket whose time has run out on the store's clock.
// Checks sweep on their own; Sweep is for a caller that wants memory back at
// once.
func (s *Store) Sweep() {
	now := s.seconds(s.now())
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepSome(now, math.MaxInt)
		sh.ops = 0
		sh.mu.Unlock()
	}
}

// sweep drops expired buckets once the shard has served as many checks as it
// holds buckets (at least 64), so that its cost per check is constant. It
// reports whether it swept.
func (sh *shard) sweep(now uint32) bool {
	sh.ops++
	if sh.ops < max(64, sh.n) {
		return false
	}
	sh.ops = 0
	sh.sweepSome(now, math.MaxInt)
	return true
}

// sweepSome visits at most n buckets, from a random place in the shard, and
// drops the expired ones.
func (sh *shard) sweepSome(now uint32, n int) {
	for _, sp := range sh.spaces {
		for k, e := range sp.buckets {
			if n--; n < 0 {
				return
			}
			if e.expires <= now {
				delete(sp.buckets, k)
				delete(sp.extra, k)
				sh.n--
			}
		}
	}
}

// space returns the shard's space of prefix, making it if need be.
func (sh *shard) space(prefix string) *space {
	if sp := sh.last; sp != nil && sp.prefix == prefix {
		return sp
	}
	sp := sh.spaces[prefix]
	if sp == nil {
		sp = &space{
			prefix:  strings.Clone(prefix),
			buckets: make(map[string]*entry),
			extra:   make(map[string]*[ratelimit.MaxLimits - 1]int64),
		}
		sh.spaces[sp.prefix] = sp
	}
	sh.last = sp
	return sp
}
