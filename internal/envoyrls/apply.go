package envoyrls

import (
	"context"
	"errors"

	"github.com/exactlimit/ratelimit"
)

// applyAll decides items as one, all or nothing, through store: with one
// item a plain Apply; on a ratelimit.BatchStore one ApplyAll call, which
// charges every item or none atomically (on Cluster, see redisstore's
// ApplyAll for what holds across slots).
//
// A store without ApplyAll gets the sequential path: every item is first
// peeked, and when any bucket lacks its cost nothing is taken; otherwise each
// is taken in turn. Between the peeks and the takes another client can drain
// a bucket: the takes stop at the first denial, and the items taken before it
// stay charged. That path is all or nothing only without concurrent clients;
// the stores of this module all have ApplyAll.
func applyAll(ctx context.Context, store ratelimit.Store, items []ratelimit.BatchItem) error {
	if len(items) == 1 {
		d, err := store.Apply(ctx, items[0].Key, items[0].Request)
		items[0].Decision = d
		return err
	}
	if as, ok := store.(ratelimit.BatchStore); ok {
		// A wrapper (package fallback's) over a store without ApplyAll
		// says so with errors.ErrUnsupported, having decided nothing.
		if err := as.ApplyAll(ctx, items); !errors.Is(err, errors.ErrUnsupported) {
			return err
		}
	}
	return applySequential(ctx, store, items)
}

func applySequential(ctx context.Context, store ratelimit.Store, items []ratelimit.BatchItem) error {
	fits := true
	for i := range items {
		r := items[i].Request
		cost := r.Cost
		if r.Peek {
			cost = 1
		}
		r.Peek = true
		d, err := store.Apply(ctx, items[i].Key, r)
		if err != nil {
			return err
		}
		d.Allowed = d.Allowed && d.Remaining >= cost
		items[i].Decision = d
		fits = fits && d.Allowed
	}
	if !fits {
		return nil
	}
	for i := range items {
		if items[i].Request.Peek {
			continue
		}
		d, err := store.Apply(ctx, items[i].Key, items[i].Request)
		if err != nil {
			return err
		}
		items[i].Decision = d
		if !d.Allowed {
			return nil
		}
	}
	return nil
}
