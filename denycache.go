package ratelimit

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit/internal/arith"
)

// CacheStats is a snapshot of a Limiter's denial cache (see WithDenyCache).
type CacheStats struct {
	// Size is the number of subjects the cache holds a denial for, expired
	// ones included until they are looked up or pushed out.
	Size int
	// Capacity is the most subjects the cache holds: the size given to
	// WithDenyCache.
	Capacity int
	// Hits counts the checks the cache denied without asking the store.
	Hits uint64
	// Misses counts the checks the cache could not decide and passed to
	// the store. Peeks, which always go to the store, count as neither.
	Misses uint64
	// Evictions counts the denials dropped, before they ran out, to make
	// room for another subject's.
	Evictions uint64
}

// HitRate returns the share of the checks the cache saw that it denied:
// Hits / (Hits + Misses), or 0 before any check.
func (s CacheStats) HitRate() float64 {
	if s.Hits+s.Misses == 0 {
		return 0
	}
	return float64(s.Hits) / float64(s.Hits+s.Misses)
}

// denyCache remembers, per store key, the latest denial the store made, and
// denies locally what that denial proves the store would deny too.
//
// A denial of cost c whose RetryAfter is r, decided at t, says that the
// binding limit B (Decision.Limit, refilling R tokens every P) reaches c
// tokens at u = t + r and not before (Step: r is the wait on the band that
// needs the longest). Until u, then:
//
//   - every cost c' >= c is denied: a bucket that lacks c tokens lacks c'.
//     The store's wait for c' may be longer than u - now; the cache reports
//     u - now, which is never longer.
//   - a cost c' < c is denied until u - ⌈(c-c')·P/R⌉ µs: band B holds c'
//     tokens at the earliest that long before it holds c (the ceiling keeps
//     the bound on the early side whatever sub-token remainder B carried).
//     A denial of c says nothing more about a smaller cost; in particular
//     a c' the bucket held at t is never denied (its bound is before t).
//
// Both rest on the bucket changing only by refill at this policy's rates and
// by the checks of this policy, which only take tokens: another process's
// Reset, a check under
// another policy (a rolling deploy) or a Redis that lost the key can each
// make the bucket admit earlier, and the cache cannot see them. It then
// denies for at most the rest of r. An admission by the store that
// contradicts an entry drops it.
//
// Times: t is the request's time (the injected clock) or, when the store uses
// its own clock, time.Now read before the store is called, floored to the
// microsecond as the store floors its own; the server decided no earlier, so
// u is no later than the store's. Lookups use the same clock.
type denyCache struct {
	seed   maphash.Seed
	shards []denyShard
	resets atomic.Uint64 // counts Resets: a denial in flight across one is not kept
}

type denyShard struct {
	mu        sync.Mutex
	entries   map[string]*denyEntry
	lru       *denyEntry // sentinel of a circular list; lru.next is the most recently used
	capacity  int
	hits      uint64
	misses    uint64
	evictions uint64
	_         [64]byte // keep shards on separate cache lines
}

type denyEntry struct {
	key        string
	prev, next *denyEntry
	cost       int64     // the cost the store denied
	until      time.Time // the earliest time the bucket may hold cost tokens
	limit      Limit     // the binding limit of the denial
	remaining  int64     // the balance the store reported
	resetAt    time.Time // when the bucket would be full, at the earliest
}

// The cache is split into shards, each its own LRU behind its own mutex, of
// at least minDenyShard entries each: a small cache is one exact LRU, and a
// large one is LRU within each of up to maxDenyShards shards.
const (
	maxDenyShards = 16
	minDenyShard  = 64
)

func newDenyCache(size int) *denyCache {
	n := max(1, min(size/minDenyShard, maxDenyShards))
	c := &denyCache{seed: maphash.MakeSeed(), shards: make([]denyShard, n)}
	for i := range c.shards {
		sh := &c.shards[i]
		sh.capacity = size / n
		if i < size%n {
			sh.capacity++
		}
		sh.entries = make(map[string]*denyEntry)
		sh.lru = &denyEntry{}
		sh.lru.prev, sh.lru.next = sh.lru, sh.lru
	}
	return c
}

func (c *denyCache) shard(key string) *denyShard {
	return &c.shards[maphash.String(c.seed, key)%uint64(len(c.shards))]
}

// bound returns the earliest time the bucket may hold cost tokens.
func (e *denyEntry) bound(cost int64) time.Time {
	if cost >= e.cost {
		return e.until
	}
	if e.limit.RefillTokens == 0 {
		// A quota bound the denial: a smaller cost may be left in its
		// window now.
		return time.Time{}
	}
	early := arith.CeilDiv((e.cost-cost)*e.limit.periodMicros(), e.limit.RefillTokens)
	return e.until.Add(-time.Duration(early) * time.Microsecond)
}

// wait returns the whole microseconds from now until t, or 0 when t is less
// than a microsecond away.
func wait(now, t time.Time) time.Duration {
	return max(0, t.Sub(now).Truncate(time.Microsecond))
}

// floorMicro returns t floored to the microsecond, keeping its monotonic
// reading.
func floorMicro(t time.Time) time.Time {
	return t.Add(-time.Duration(t.Nanosecond() % 1000))
}

// lookup denies a check of cost at now when the entry for key proves the
// store would. present reports whether there was an entry for key at all.
func (c *denyCache) lookup(key string, cost int64, now time.Time) (d Decision, hit, present bool) {
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entries[key]
	if e == nil {
		sh.misses++
		return Decision{}, false, false
	}
	if wait(now, e.until) == 0 {
		sh.remove(e) // it can deny nothing any more
		sh.misses++
		return Decision{}, false, false
	}
	retry := wait(now, e.bound(cost))
	if retry == 0 {
		sh.misses++
		return Decision{}, false, true
	}
	sh.hits++
	sh.touch(e)
	return Decision{
		Remaining:  e.remaining,
		RetryAfter: retry,
		ResetAfter: max(retry, wait(now, e.resetAt)),
		Limit:      e.limit,
		Source:     SourceCache,
	}, true, true
}

// record learns from a decision the store made at t of a check of cost
// (for a peek, 1). resets is the Reset count read before the store was
// called.
func (c *denyCache) record(key string, cost int64, peek bool, d Decision, t time.Time, resets uint64) {
	if d.Source != SourceStore {
		return // an outage behaviour's decision says nothing about the store's bucket
	}
	sh := c.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entries[key]
	if d.Allowed {
		if e == nil {
			return
		}
		// Every cost up to what the bucket held before the check was
		// admissible at t: an entry that denies one of them is stale.
		held := d.Remaining
		if !peek {
			held += cost
		}
		if wait(t, e.bound(held)) > 0 {
			sh.remove(e)
		}
		return
	}
	if d.RetryAfter <= 0 || c.resets.Load() != resets {
		return
	}
	if e == nil {
		if len(sh.entries) >= sh.capacity {
			sh.evict(t)
		}
		e = &denyEntry{key: key}
		sh.entries[key] = e
		sh.pushFront(e)
	} else {
		sh.touch(e)
	}
	t = floorMicro(t)
	e.cost = cost
	e.until = t.Add(d.RetryAfter)
	e.limit = d.Limit
	e.remaining = d.Remaining
	e.resetAt = t.Add(d.ResetAfter)
}

// forget drops the entry for key, and keeps out a denial that was in flight
// while key was reset.
func (c *denyCache) forget(key string) {
	c.resets.Add(1)
	sh := c.shard(key)
	sh.mu.Lock()
	if e := sh.entries[key]; e != nil {
		sh.remove(e)
	}
	sh.mu.Unlock()
}

func (c *denyCache) stats() CacheStats {
	var s CacheStats
	for i := range c.shards {
		sh := &c.shards[i]
		sh.mu.Lock()
		s.Size += len(sh.entries)
		s.Capacity += sh.capacity
		s.Hits += sh.hits
		s.Misses += sh.misses
		s.Evictions += sh.evictions
		sh.mu.Unlock()
	}
	return s
}

// evict makes room for one entry: the least recently used, unless it has
// run out anyway.
func (sh *denyShard) evict(now time.Time) {
	e := sh.lru.prev
	if e == sh.lru {
		return
	}
	if wait(now, e.until) > 0 {
		sh.evictions++
	}
	sh.remove(e)
}

func (sh *denyShard) remove(e *denyEntry) {
	delete(sh.entries, e.key)
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
}

func (sh *denyShard) pushFront(e *denyEntry) {
	e.prev, e.next = sh.lru, sh.lru.next
	e.next.prev = e
	sh.lru.next = e
}

func (sh *denyShard) touch(e *denyEntry) {
	if sh.lru.next == e {
		return
	}
	e.prev.next, e.next.prev = e.next, e.prev
	sh.pushFront(e)
}
