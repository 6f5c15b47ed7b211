package redisstore

import (
	"context"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyAll decides items as one, all or nothing (see ratelimit.BatchStore):
// every cost is taken when every item's bucket holds it, and none otherwise.
// The items are decided at one time, so their Request.Now must be equal (the
// zero Time: the server's TIME).
//
// On a single server (and on Cluster when every key hashes to one slot) that
// is one script call on all the keys, atomic. On Cluster, keys of several
// slots cannot meet in one script: ApplyAll first asks each slot's keys, in
// one script call per slot, whether they hold their costs without taking
// anything, and only when all do takes them, in one atomic call per slot.
// Nothing is taken for a request that some bucket denies, unless another
// check takes from one of its buckets between the two steps: then the slots
// that had taken keep the charge while another denies, a charge without an
// admission (never an admission beyond the policy), and ApplyAll reports
// each item's own decision with the error nil.
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
	groups := [][]*ratelimit.BatchItem{nil}
	if s.cluster == nil {
		for i := range items {
			groups[0] = append(groups[0], &items[i])
		}
	} else {
		bySlot := map[uint16]int{}
		groups = groups[:0]
		for i := range items {
			sl := keyfmt.Slot(items[i].Key)
			g, ok := bySlot[sl]
			if !ok {
				g = len(groups)
				bySlot[sl] = g
				groups = append(groups, nil)
			}
			groups[g] = append(groups[g], &items[i])
		}
	}
	if len(groups) == 1 {
		return s.evalAll(ctx, groups[0], false)
	}
	// Several slots: ask first, then take.
	if err := s.eachGroup(ctx, groups, true); err != nil {
		return err
	}
	for i := range items {
		if !items[i].Decision.Allowed {
			return nil
		}
	}
	return s.eachGroup(ctx, groups, false)
}

// eachGroup runs evalAll on every group at once and returns the first error.
func (s *Store) eachGroup(ctx context.Context, groups [][]*ratelimit.BatchItem, dry bool) error {
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for g := range groups {
		wg.Go(func() { errs[g] = s.evalAll(ctx, groups[g], dry) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// evalAll decides items in one script call on their keys, all or nothing;
// dry asks for each cost without taking anything. A key's error is the
// call's.
func (s *Store) evalAll(ctx context.Context, items []*ratelimit.BatchItem, dry bool) error {
	keys := make([]string, len(items))
	args := script.CallArgs(items[0].Request, script.All, len(items))
	for i, it := range items {
		keys[i] = it.Key
		r := it.Request
		if dry && !r.Peek {
			r.Cost = -r.Cost // ask for it, take nothing
		}
		args = s.enc.AppendRequest(args, r)
	}
	res, err := s.eval(ctx, keys, args)
	if err != nil {
		return wrapErr("check", keys[0], err)
	}
	entries, err := script.Entries(res, len(items))
	if err != nil {
		return wrapErr("check", keys[0], err)
	}
	for i, it := range items {
		d, err := script.ParseAt(it.Request, entries[i], res)
		if err != nil {
			return wrapErr("check", it.Key, err)
		}
		it.Decision, it.Err = d, nil
	}
	return nil
}
