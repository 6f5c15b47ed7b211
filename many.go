package ratelimit

import (
	"context"
	"time"
)

// Item is one check of a TryAcquireMany: cost tokens for a subject.
type Item[K any] struct {
	// Subject is whose bucket the check is on.
	Subject K
	// Cost is the number of tokens to take, between 1 and the capacity.
	Cost int64
}

// Result is the outcome of one Item of a TryAcquireMany: a Decision, or the
// error that kept that item from being decided.
type Result struct {
	// Decision is the item's decision; the zero Decision when Err is set.
	Decision Decision
	// Err is why the item could not be decided: an invalid argument
	// (wrapping ErrInvalidArgument, and the item never reached the store)
	// or the store's error for that item (for example, its Redis Cluster
	// master is down).
	Err error
}

// TryAcquireMany decides every item as TryAcquireN would, and returns one
// Result per item, in input order. The items are independent decisions, not
// a transaction: each takes its cost or not on its own, and some items may
// be decided while others carry an error. Items on the same subject are
// decided one after the other in input order, each seeing what the ones
// before it took.
//
// With WithClock the clock is read once, and every item is decided at that
// time. Invalid items get an error wrapping ErrInvalidArgument and are not
// sent; items the denial cache can decide are not sent either. The rest go to
// the store in one call when it is a BatchStore (redisstore: one pipeline on
// a standalone server, one per master in parallel on a Cluster), and
// otherwise in one Apply per item, one after the other. A store that wraps
// another, such as fallback.Store, batches only when it is a BatchStore
// itself.
func (l *Limiter[K]) TryAcquireMany(ctx context.Context, items []Item[K]) []Result {
	res := make([]Result, len(items))
	if len(items) == 0 {
		return res
	}
	var now time.Time
	if l.clock != nil {
		now = l.clock()
	}
	observed := l.cache != nil || l.obs != nil
	var start, at time.Time
	if observed {
		start = time.Now()
		at = now
		if at.IsZero() {
			at = start
		}
	}
	batch := make([]BatchItem, 0, len(items))
	index := make([]int, 0, len(items))
	var present []bool
	if l.cache != nil {
		present = make([]bool, 0, len(items))
	}
	for i, it := range items {
		key, r, err := l.requestAt(it.Subject, it.Cost, false, now)
		if err != nil {
			res[i].Err = err
			l.failed(ctx, l.errKey(it.Subject), opAcquire, it.Cost, err, time.Time{})
			continue
		}
		if l.cache != nil {
			d, hit, p := l.cache.lookup(key, it.Cost, at)
			if hit {
				res[i].Decision = d
				l.decided(ctx, key, it.Cost, false, d, start)
				continue
			}
			present = append(present, p)
		}
		batch = append(batch, BatchItem{Key: key, Request: r})
		index = append(index, i)
	}
	if len(batch) == 0 {
		return res
	}
	var resets uint64
	if l.cache != nil {
		resets = l.cache.resets.Load()
	}
	if bs, ok := l.store.(BatchStore); ok {
		bs.ApplyBatch(ctx, batch)
	} else {
		for j := range batch {
			b := &batch[j]
			b.Decision, b.Err = l.store.Apply(ctx, b.Key, b.Request)
		}
	}
	for j, b := range batch {
		i := index[j]
		if b.Err != nil {
			res[i].Err = b.Err
			l.failed(ctx, b.Key, opAcquire, b.Request.Cost, b.Err, start)
			continue
		}
		res[i].Decision = b.Decision
		if l.cache != nil && (!b.Decision.Allowed || present[j]) {
			l.cache.record(b.Key, b.Request.Cost, false, b.Decision, at, resets)
		}
		if observed {
			l.decided(ctx, b.Key, b.Request.Cost, false, b.Decision, start)
		}
	}
	return res
}
