package memstore

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/tokenbucket"
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

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyAll decides items together, all or nothing (see
// ratelimit.BatchStore), with tokenbucket.StepAll: it locks the shards of
// every item's bucket, each once and in a fixed order, and takes the costs
// only when every item is allowed (a peek too, which takes nothing: it
// needs a token). Otherwise it changes nothing, and each Decision is the one
// State.Step would give with nothing taken: an item its bucket alone admits
// reports the untouched balance. The items are decided at one time, as the
// Redis script decides them, so their Request.Now must be equal (the zero
// Time: the store's clock).
//
// The error means nothing was decided and nothing taken: the context's
// error when ctx is cancelled, and otherwise one wrapping
// ratelimit.ErrInvalidArgument (an invalid item, two items with one key, or
// items at different times). Item Errs are not used.
//
// The store keeps none of the items' keys or limits once ApplyAll returns.
func (s *Store) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(items) == 0 {
		return nil
	}
	if err := tokenbucket.ValidateAll(items); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	clock := s.now()
	us := clock
	if now := items[0].Request.Now; !now.IsZero() {
		us = now.UnixMicro()
	} else if _, err := tokenbucket.Micros(time.UnixMicro(us)); err != nil {
		return fmt.Errorf("memstore: the store's clock: %w", err)
	}

	w := scratchPool.Get().(*scratch)
	w.reset(len(items))
	defer func() {
		w.reset(0) // keep no key or limits of the caller's
		scratchPool.Put(w)
	}()
	var shards uint64 // a bit per shard involved
	for i := range items {
		c := &w.checks[i]
		c.p = s.policyFor(items[i].Request.Limits, items[i].Request.Quotas)
		c.prefix, c.subject = keyfmt.Split(items[i].Key)
		c.shard = s.shardIndex(c.prefix, c.subject)
		shards |= 1 << c.shard
		w.rs[i] = items[i].Request
	}
	swept := false
	for m := shards; m != 0; m &= m - 1 {
		sh := &s.shards[bits.TrailingZeros64(m)]
		sh.mu.Lock()
		swept = s.sweep(sh, clock) || swept
	}
	for i := range items {
		c := &w.checks[i]
		sh := &s.shards[c.shard]
		w.states[i], c.e = sh.load(sh.spaces[c.prefix], c.subject, &w.bands[i])
		w.sts[i] = &w.states[i]
	}
	if tokenbucket.StepAll(w.sts, w.rs, us, w.ds, w.ttls) {
		// Update the buckets there are before adding any, which may move
		// them.
		for _, adding := range []bool{false, true} {
			for i := range items {
				c := &w.checks[i]
				if w.rs[i].Peek || (c.e == nil) != adding {
					continue
				}
				sh := &s.shards[c.shard]
				s.store(sh, sh.spaces[c.prefix], c.prefix, c.subject, w.states[i], c.p, c.e, s.expiry(clock, w.ttls[i]))
			}
		}
	}
	for m := shards; m != 0; m &= m - 1 {
		s.shards[bits.TrailingZeros64(m)].unlock()
	}
	for i := range items {
		items[i].Decision, items[i].Err = w.ds[i], nil
	}
	if swept {
		s.sweepOther(clock)
	}
	return nil
}

// scratch is the working memory of one ApplyAll, kept in a pool so that a
// call allocates nothing.
type scratch struct {
	checks []check
	bands  [][tokenbucket.MaxLimits]tokenbucket.Band
	states []tokenbucket.State
	sts    []*tokenbucket.State
	rs     []ratelimit.Request
	ds     []ratelimit.Decision
	ttls   []time.Duration
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// reset sizes w for n items, zeroing what a former call left.
func (w *scratch) reset(n int) {
	w.checks = resize(w.checks, n)
	w.bands = resize(w.bands, n)
	w.states = resize(w.states, n)
	w.sts = resize(w.sts, n)
	w.rs = resize(w.rs, n)
	w.ds = resize(w.ds, n)
	w.ttls = resize(w.ttls, n)
}

// resize returns s with n zero elements, reusing its array when it is large
// enough, and zeroes the elements it drops.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	clear(s)
	return s[:n]
}

// check is one item of ApplyAll on its way.
type check struct {
	prefix, subject string
	shard           int
	p               *policy
	e               *entry // the bucket, nil when there is none
}
