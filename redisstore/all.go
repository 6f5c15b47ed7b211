package redisstore

import (
	"context"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyAll decides items as one, all or nothing (see ratelimit.BatchStore):
// every cost is taken when every item's bucket holds it, and none otherwise.
// The items are decided at one time, so their Request.Now must be equal (the
// zero Time: the server's TIME).
//
// On a single server (and on Cluster when every key hashes to one slot) that
// is one script call on all the keys, atomic. It goes through the master's
// lanes as a check does (see "Coalescing" in the package documentation):
// when every lane is busy it waits in the queue, and the keys of ApplyAll
// calls queued together, with the checks, share script calls of up to 16
// keys, each ApplyAll's keys decided all or nothing and independently of the
// others, in order (one of more keys is a call of its own).
//
// On Cluster, keys of several slots cannot meet in one script: ApplyAll
// first asks each slot's keys, in one script call per slot, whether they
// hold their costs without taking anything, and only when all do takes them,
// in one atomic call per slot. Nothing is taken for a request that some
// bucket denies, unless another check takes from one of its buckets between
// the two steps: then the slots that had taken keep the charge while another
// denies, a charge without an admission (never an admission beyond the
// policy), and ApplyAll reports each item's own decision with the error nil.
func (s *Store) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	if err := tokenbucket.ValidateAll(items); err != nil {
		return err
	}
	switch len(items) {
	case 0:
		return nil
	case 1:
		// One key is one check, sent through the master's lanes with the
		// others.
		d, err := s.check(ctx, items[0].Key, items[0].Request)
		if err != nil {
			return err
		}
		items[0].Decision = d
		return nil
	}
	if s.cluster == nil {
		return s.applyGroup(ctx, groupOf(items, nil))
	}
	bySlot := map[uint16]int{}
	var slots [][]int // the items of each slot, by index
	for i := range items {
		sl := keyfmt.Slot(items[i].Key)
		g, ok := bySlot[sl]
		if !ok {
			g = len(slots)
			bySlot[sl] = g
			slots = append(slots, nil)
		}
		slots[g] = append(slots[g], i)
	}
	if len(slots) == 1 {
		return s.applyGroup(ctx, groupOf(items, nil))
	}
	// Several slots: ask first, then take.
	asks := make([]ratelimit.BatchItem, len(items))
	for i, it := range items {
		asks[i] = it
		if !it.Request.Peek {
			asks[i].Request.Cost = -it.Request.Cost // ask for it, take nothing
			if c := it.Request.Costs; c != nil {
				asks[i].Request.Costs = make([]int64, len(c))
				for j := range c {
					asks[i].Request.Costs[j] = -c[j]
				}
			}
		}
	}
	if err := s.eachGroup(ctx, asks, slots); err != nil {
		return err
	}
	all := true
	for i := range items {
		items[i].Decision = asks[i].Decision
		all = all && items[i].Decision.Allowed
	}
	if !all {
		return nil
	}
	return s.eachGroup(ctx, items, slots)
}

// groupOf returns the group of items at the given indexes, or of every
// item when idx is nil.
func groupOf(items []ratelimit.BatchItem, idx []int) group {
	if idx == nil {
		g := make(group, len(items))
		for i := range items {
			g[i] = &items[i]
		}
		return g
	}
	g := make(group, len(idx))
	for j, i := range idx {
		g[j] = &items[i]
	}
	return g
}

// eachGroup runs applyGroup on the group of items of every slot at once
// and returns the first error.
func (s *Store) eachGroup(ctx context.Context, items []ratelimit.BatchItem, slots [][]int) error {
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for g, idx := range slots {
		wg.Go(func() { errs[g] = s.applyGroup(ctx, groupOf(items, idx)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
