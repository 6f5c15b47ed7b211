package memstore

import (
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/exactlimit/ratelimit"
)

// fastHit is a copy of the bucket of one hot subject of a shard (a short
// subject checked twice in a row under a policy of one limit), kept where a
// check reads it without the shard's lock. A check that would write nothing,
// a denial or a peek, is decided from it alone: goroutines checking one
// subject that is being denied, the commonest hot subject, then only read
// shared memory, and do not pass the lock between them.
//
// It is a sequence lock: the shard's lock holder writes it between two
// increments of seq, and a reader that finds seq odd, or changed once it has
// read the rest, takes the lock instead. Every field is atomic, so that the
// reads racing with a write are reads the memory model defines; what a
// reader reads between two equal even values of seq is what the lock holder
// last published, as it was.
type fastHit struct {
	seq         atomic.Uint64
	sp          atomic.Pointer[space] // the subject's space; nil: nothing published
	k0, k1      atomic.Uint64         // the subject's short key, as two words
	p           atomic.Pointer[policy]
	last, level atomic.Int64
}

// published is what the lock holder knows of the bucket fastHit copies.
type published struct {
	e           *entry // its entry; nil: nothing published
	last, level int64  // e's state as published
	pol         uint32 // e's policy as published
}

// fastCount is the number of checks decided without the lock that one of
// them, chosen at random, counts towards the shard's sweep: they are
// counted, together, without a write to shared memory on the others.
const fastCount = 64

// decideFast decides r from the shard's fastHit when that is the bucket of
// prefix and the subject whose short has the words k0 and k1, r's policy is
// the bucket's own of one limit, with one cost (no Costs), and the decision
// writes nothing. It reports whether it decided; otherwise the check must be
// made under the lock.
func (sh *shard) decideFast(prefix string, k0, k1 uint64, r *ratelimit.Request, us int64, d *ratelimit.Decision) bool {
	f := &sh.fast
	seq := f.seq.Load()
	sp := f.sp.Load()
	if seq&1 != 0 || sp == nil || f.k0.Load() != k0 || f.k1.Load() != k1 || sp.prefix != prefix {
		return false
	}
	p := f.p.Load()
	b := scalar{found: true, last: f.last.Load(), level: f.level.Load()}
	if f.seq.Load() != seq || !p.one || len(r.Limits) != 1 || p.limits[0] != r.Limits[0] || r.Costs != nil || r.Quotas != nil ||
		!r.Peek && (r.Cost < 1 || r.Cost > p.minCap) {
		return false
	}
	if !r.Peek && b.level >= r.Cost*p.low.p {
		return false // admitted whatever the refill: a write
	}
	_, write := stepOne(d, p.low, r.Limits[0], r.Cost, r.Peek, us, &b)
	return !write
}

// countFast counts, now and then, the checks decideFast decided towards
// sh's sweep, and sweeps when that is due. clock is the store's clock (µs),
// and ns what nowNs read with it: the default clock's nanoseconds, which
// vary enough from check to check to pick one in fastCount at random, more
// cheaply than a random number. It does not wait for the lock: a shard whose
// lock is held is being checked, and counted, by another goroutine.
func (s *Store) countFast(sh *shard, clock int64, ns time.Duration) {
	dice := uint32(uint64(ns) * 0x9e3779b97f4a7c15 >> 32)
	if s.clock != nil {
		dice = rand.Uint32()
	}
	if dice%fastCount != 0 || !sh.mu.TryLock() {
		return
	}
	sh.ops += fastCount - 1
	swept := s.sweep(sh, clock)
	sh.unlock()
	if swept {
		s.sweepOther(clock)
	}
}

// publish makes e, the entry of the subject of key k in sp, the bucket
// sh's fastHit copies, when its policy is of one limit, and sh the store's
// hot shard. sh must be locked, and e as the lock holder leaves it.
func (s *Store) publish(sh *shard, sp *space, k short, e *entry) {
	if sh.pub.e == e || !sh.pols[e.pol].p.one {
		return
	}
	s.hot.Store(sh)
	f := &sh.fast
	f.seq.Add(1)
	f.sp.Store(sp)
	f.k0.Store(binary.LittleEndian.Uint64(k[:8]))
	f.k1.Store(binary.LittleEndian.Uint64(k[8:]))
	f.p.Store(sh.pols[e.pol].p)
	f.last.Store(e.last)
	f.level.Store(e.level)
	f.seq.Add(1)
	sh.pub = published{e: e, last: e.last, level: e.level, pol: e.pol}
}

// unlock empties sh's fastHit when the lock holder wrote the bucket it
// copies, and unlocks sh. Every change of a shard's buckets ends with it. The
// next denial of the subject under the lock publishes it again: a subject
// admitted check after check is not copied out at each.
func (sh *shard) unlock() {
	if e := sh.pub.e; e != nil && (e.last != sh.pub.last || e.level != sh.pub.level || e.pol != sh.pub.pol) {
		sh.unpublish()
	}
	sh.mu.Unlock()
}

// unpublish empties sh's fastHit. sh must be locked.
func (sh *shard) unpublish() {
	if sh.pub.e == nil {
		return
	}
	f := &sh.fast
	f.seq.Add(1)
	f.sp.Store(nil)
	f.p.Store(nil) // keep no policy the shard may drop
	f.seq.Add(1)
	sh.pub = published{}
}

// forget clears what sh remembers of the latest check's bucket and empties
// its fastHit, before an entry may move or be reused: a bucket added or
// dropped, or a table compacted. sh must be locked.
func (sh *shard) forget() {
	sh.hit = hit{}
	sh.unpublish()
}
