package memstore

import (
	"context"
	"fmt"
	"math/bits"
	"time"

	"github.com/exactlimit/ratelimit"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyBatch decides every item as Apply would, one after the other in input
// order, filling in its Decision or Err. The items are independent
// decisions, not a transaction. The store is in this process, so a batch
// saves no round trip; it is here so that Limiter.TryAcquireMany and the
// other batch callers treat every store alike.
func (s *Store) ApplyBatch(ctx context.Context, items []ratelimit.BatchItem) {
	for i := range items {
		it := &items[i]
		it.Decision, it.Err = s.Apply(ctx, it.Key, it.Request)
	}
}

var _ ratelimit.AtomicStore = (*Store)(nil)

// ApplyAll decides items together, all or nothing (see
// ratelimit.AtomicStore): it locks the shards of every item's bucket, each
// once and in a fixed order, decides each item with Step on a copy of its
// bucket, and takes the costs only when every item that is not a peek is
// allowed. Otherwise it takes nothing: an item its bucket alone would have
// admitted reports the untouched balance, as a peek would, and the others
// their denial. Every Decision is Step's, and each bucket is left as Step
// leaves it after that decision (refilled, and taken from only when all are
// allowed).
//
// The error, when ctx is cancelled or an item is invalid or two items share
// a key, means nothing was decided; an invalid item's error wraps
// ratelimit.ErrInvalidArgument. Item Errs are not used.
func (s *Store) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(items) == 0 {
		return nil
	}
	var buf [4]check
	cs := buf[:0]
	if len(items) > len(buf) {
		cs = make([]check, 0, len(items))
	}
	clock := s.now()
	var shards uint64 // a bit per shard involved
	for i := range items {
		it := &items[i]
		r := it.Request
		if err := r.Validate(); err != nil {
			return fmt.Errorf("memstore: item %d: %w", i, err)
		}
		us := clock
		if !r.Now.IsZero() {
			us = r.Now.UnixMicro()
		} else if _, err := ratelimit.Micros(time.UnixMicro(us)); err != nil {
			return fmt.Errorf("memstore: item %d: the store's clock: %w", i, err)
		}
		c := check{us: us, p: s.policyFor(r.Limits)}
		c.prefix, c.subject = split(it.Key)
		c.shard = s.shardIndex(c.prefix, c.subject)
		shards |= 1 << c.shard
		cs = append(cs, c)
	}
	if i, j, dup := duplicate(items); dup {
		return fmt.Errorf("%w: items %d and %d have the same key %q", ratelimit.ErrInvalidArgument, i, j, items[i].Key)
	}

	swept := false
	for m := shards; m != 0; m &= m - 1 {
		sh := &s.shards[bits.TrailingZeros64(m)]
		sh.mu.Lock()
		swept = s.sweep(sh, clock) || swept
	}
	all := true
	for i := range cs {
		c := &cs[i]
		r := items[i].Request
		sh := &s.shards[c.shard]
		st, e := sh.load(sh.spaces[c.prefix], c.subject, &c.bands)
		c.e, c.was, c.wasLast, c.wasN = e, c.bands, st.Last, len(st.Bands)
		c.d, c.ttl, c.write = st.Step(r, c.us)
		c.last, c.n = st.Last, len(st.Bands)
		if !r.Peek && !c.d.Allowed {
			all = false
		}
	}
	if !all {
		// Take nothing: decide each admitted item again as a peek on its
		// untouched bucket, which reports the balance without taking it.
		for i := range cs {
			c := &cs[i]
			r := items[i].Request
			if r.Peek || !c.d.Allowed {
				continue
			}
			c.bands = c.was
			st := ratelimit.State{Last: c.wasLast, Bands: c.bands[:c.wasN]}
			r.Peek = true
			c.d, c.ttl, c.write = st.Step(r, c.us)
			c.last, c.n = st.Last, len(st.Bands)
		}
	}
	// Update the existing buckets before adding any, which may move them.
	for _, adding := range []bool{false, true} {
		for i := range cs {
			c := &cs[i]
			if !c.write || (c.e == nil) != adding {
				continue
			}
			sh := &s.shards[c.shard]
			sp := sh.spaces[c.prefix]
			st := ratelimit.State{Last: c.last, Bands: c.bands[:c.n]}
			s.store(sh, sp, c.prefix, c.subject, st, c.p, c.e, s.expiry(clock, c.ttl))
		}
	}
	for m := shards; m != 0; m &= m - 1 {
		s.shards[bits.TrailingZeros64(m)].mu.Unlock()
	}
	for i := range cs {
		items[i].Decision, items[i].Err = cs[i].d, nil
	}
	if swept {
		other := &s.shards[s.cursor.Add(1)%shardCount]
		other.mu.Lock()
		s.sweepSome(other, s.cutoff(clock), 256)
		other.mu.Unlock()
	}
	return nil
}

// check is one item of ApplyAll on its way.
type check struct {
	prefix, subject string
	shard           int
	p               *policy
	us              int64
	e               *entry // the bucket, nil when there is none
	last            int64  // the State's Last, its Bands being bands[:n]
	n               int
	bands           [ratelimit.MaxLimits]ratelimit.Band
	was             [ratelimit.MaxLimits]ratelimit.Band // bands before Step
	wasLast         int64                               // st.Last before Step
	wasN            int                                 // len(st.Bands) before Step
	d               ratelimit.Decision
	ttl             time.Duration
	write           bool
}

// duplicate reports the first two items that share a key.
func duplicate(items []ratelimit.BatchItem) (int, int, bool) {
	if len(items) <= 16 {
		for i := range items {
			for j := i + 1; j < len(items); j++ {
				if items[i].Key == items[j].Key {
					return i, j, true
				}
			}
		}
		return 0, 0, false
	}
	seen := make(map[string]int, len(items))
	for j, it := range items {
		if i, ok := seen[it.Key]; ok {
			return i, j, true
		}
		seen[it.Key] = j
	}
	return 0, 0, false
}
