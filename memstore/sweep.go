package memstore

import (
	"context"
	"math"

	"github.com/exactlimit/ratelimit/internal/keyfmt"
)

// sweepOther sweeps a bounded number of buckets of the next shard in turn,
// after a check swept its own, so that shards that see no checks are swept by
// the others. clock is the store's clock (µs).
func (s *Store) sweepOther(clock int64) {
	other := &s.shards[s.cursor.Add(1)%shardCount]
	other.mu.Lock()
	s.sweepSome(other, s.cutoff(clock), 256)
	other.unlock()
}

// Reset deletes the bucket at key, so that its next check starts full.
func (s *Store) Reset(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	prefix, subject := keyfmt.Split(key)
	sh := s.shardOf(prefix, subject)
	sh.mu.Lock()
	if sp := sh.spaces[prefix]; sp != nil {
		var e entry
		var found bool
		switch {
		case len(subject) <= maxShort:
			e, found = sp.short.remove(shortWords(subject))
		case len(subject) <= maxMid:
			e, found = sp.mid.remove(midKey(subject))
		default:
			e, found = sp.long.remove(subject)
		}
		if found {
			s.dropped(sh, sp, e)
			s.tidy(sh, sp)
			sh.shrink()
		}
	}
	sh.unlock()
	return nil
}

// dropped accounts for the bucket e, just deleted from sp.
func (s *Store) dropped(sh *shard, sp *space, e entry) {
	sp.n--
	sh.n--
	sh.forget()
	s.unref(sh, e.pol)
}

// tidy drops sp when it holds no bucket any more, and compacts its tables
// when they are mostly empty.
func (s *Store) tidy(sh *shard, sp *space) {
	if sp.n == 0 {
		delete(sh.spaces, sp.prefix)
		if sh.last == sp {
			sh.last = nil
		}
		sh.forget()
		return
	}
	// Compacting moves entries.
	short, mid, long := sp.short.compact(), sp.mid.compact(), sp.long.compact()
	if short || mid || long {
		sh.forget()
	}
}

// shrink copies the shard's map of spaces into a smaller one once it holds
// less than a quarter of its most.
func (sh *shard) shrink() { sh.spaces, sh.peak = shrunk(sh.spaces, sh.peak) }

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

// Sweep drops every bucket whose time has run out on the store's clock, with
// the namespaces and policies left without a bucket. Checks sweep on their
// own; Sweep is for a caller that wants memory back at once.
func (s *Store) Sweep() {
	now := s.seconds(s.now())
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		s.sweepSome(sh, now, math.MaxInt)
		sh.ops = 0
		sh.recent = nil
		sh.unlock()
	}
	s.polMu.Lock()
	s.prune(nil)
	s.polMu.Unlock()
}

// sweep drops the buckets of sh that expired linger seconds before clock (µs)
// once the shard has served twice as many checks as it holds buckets (at
// least 64), so that its cost per check is constant: half a bucket visited.
// It reports whether it swept.
func (s *Store) sweep(sh *shard, clock int64) bool {
	sh.ops++
	if sh.ops < max(64, 2*sh.n) {
		return false
	}
	sh.ops = 0
	s.sweepSome(sh, s.cutoff(clock), math.MaxInt)
	return true
}

// sweepSome visits at most n buckets of sh, from a random place, and drops
// those that expired by the second upTo, with the spaces left empty.
func (s *Store) sweepSome(sh *shard, upTo uint32, n int) {
	for _, sp := range sh.spaces {
		gone := func(e entry) { s.dropped(sh, sp, e) }
		n = sp.short.sweepSome(upTo, n, gone)
		n = sp.mid.sweep(upTo, n, gone)
		n = sp.long.sweep(upTo, n, gone)
		s.tidy(sh, sp)
		if n <= 0 {
			break
		}
	}
	sh.shrink()
}
