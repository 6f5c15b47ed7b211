// Package memstore is a ratelimit.Store that keeps token buckets in this
// process: for a single instance, for tests, and as the local bucket of
// package fallback.
//
// It decides with ratelimit's Step, the same exact arithmetic as the Redis
// script, so a Limiter gives the same Decisions on either store. Buckets are
// spread over shards, each behind its own mutex. A bucket is dropped once it
// would be full again (the same moment its Redis key would expire): each
// shard sweeps out such buckets after as many checks as it holds buckets, so
// memory follows the subjects active within one refill window at a constant
// amortized cost per check. The store starts no goroutine.
//
// A Store is safe for simultaneous use by multiple goroutines.
package memstore

import (
	"context"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
)

const shardCount = 64

// Store keeps token buckets in memory. The zero Store is not usable; call New.
type Store struct {
	seed   maphash.Seed
	clock  func() time.Time
	cursor atomic.Uint32 // the next shard a sweep visits besides its own
	shards [shardCount]shard
}

type shard struct {
	mu      sync.Mutex
	buckets map[string]*entry
	ops     int
	_       [40]byte // keep shards on separate cache lines
}

type entry struct {
	st      ratelimit.State
	expires int64 // µs on the store's clock: the bucket is full by then
}

// Option configures a Store.
type Option func(*Store)

// WithClock sets the store's own clock (default time.Now). It decides the
// requests that carry no time (the zero Request.Now), and it times the
// expiry of every bucket, as the server's clock does for Redis keys.
func WithClock(clock func() time.Time) Option { return func(s *Store) { s.clock = clock } }

// New returns an empty Store.
func New(opts ...Option) *Store {
	s := &Store{seed: maphash.MakeSeed(), clock: time.Now}
	for _, o := range opts {
		o(s)
	}
	for i := range s.shards {
		s.shards[i].buckets = make(map[string]*entry)
	}
	return s
}

// Apply decides r against the bucket at key and updates it, atomically with
// respect to every other call on the same key. It honours ctx only in that a
// cancelled context is an error: the decision itself never blocks.
func (s *Store) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := ctx.Err(); err != nil {
		return ratelimit.Decision{}, err
	}
	if err := r.Validate(); err != nil {
		return ratelimit.Decision{}, err
	}
	// Buckets expire on the store's own clock, as Redis keys expire on the
	// server's, whatever time the request carries.
	storeNow := s.clock()
	clock := storeNow.UnixMicro()
	now := r.Now
	if now.IsZero() {
		now = storeNow
	}
	us, err := ratelimit.Micros(now)
	if err != nil {
		return ratelimit.Decision{}, err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	swept := sh.sweep(clock)
	e := sh.buckets[key]
	fresh := e == nil
	if fresh {
		e = &entry{}
	}
	d, ttl, write := e.st.Step(r, us)
	if write {
		e.expires = clock + ttl.Microseconds()
		if fresh {
			sh.buckets[key] = e
		}
	}
	sh.mu.Unlock()
	if swept {
		// Shards that see no checks are swept by the others, a bounded
		// number of buckets at a time.
		other := &s.shards[s.cursor.Add(1)%shardCount]
		other.mu.Lock()
		other.sweepSome(clock, 256)
		other.mu.Unlock()
	}
	return d, nil
}

// Reset deletes the bucket at key, so that its next check starts full.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	sh := s.shard(key)
	sh.mu.Lock()
	delete(sh.buckets, key)
	sh.mu.Unlock()
	return nil
}

// Len returns the number of buckets held: those not yet swept out.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.buckets)
		sh.mu.Unlock()
	}
	return n
}

// Sweep drops every bucket whose time has run out on the store's clock.
// Checks sweep on their own; Sweep is for a caller that wants memory back at
// once.
func (s *Store) Sweep() {
	us := s.clock().UnixMicro()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.sweepAll(us)
		sh.mu.Unlock()
	}
}

func (s *Store) shard(key string) *shard {
	return &s.shards[maphash.String(s.seed, key)%shardCount]
}

// sweep drops expired buckets once the shard has served as many checks as it
// holds buckets (at least 64), so that its cost per check is constant. It
// reports whether it swept.
func (sh *shard) sweep(now int64) bool {
	sh.ops++
	if sh.ops < max(64, len(sh.buckets)) {
		return false
	}
	sh.sweepAll(now)
	return true
}

func (sh *shard) sweepAll(now int64) {
	sh.ops = 0
	for k, e := range sh.buckets {
		if e.expires <= now {
			delete(sh.buckets, k)
		}
	}
}

// sweepSome visits at most n buckets, from a random place in the shard, and
// drops the expired ones.
func (sh *shard) sweepSome(now int64, n int) {
	for k, e := range sh.buckets {
		if n--; n < 0 {
			return
		}
		if e.expires <= now {
			delete(sh.buckets, k)
		}
	}
}
