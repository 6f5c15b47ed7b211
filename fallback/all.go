package fallback

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlimit/ratelimit"
)

var _ ratelimit.AtomicStore = (*Store)(nil)

// ApplyAll decides items as one, all or nothing (see ratelimit.AtomicStore),
// through the primary while every item's partition is alive, and with the
// outage behaviour otherwise: LocalFallback decides them as one on the local
// buckets (under the fleet share), FailOpen admits them all, FailClosed
// denies them all, and ReturnError returns an error wrapping ErrUnavailable.
// A primary call that fails with an unreachable error marks the first item's
// partition down. The primary must be a ratelimit.AtomicStore (memstore and
// redisstore are); otherwise ApplyAll returns an error wrapping
// errors.ErrUnsupported and decides nothing.
func (s *Store) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	for i := range items {
		it := &items[i]
		it.Decision, it.Err = ratelimit.Decision{}, nil
		if err := it.Request.Validate(); err != nil {
			return fmt.Errorf("item %d: %w", i, err)
		}
	}
	if len(items) == 0 {
		return nil
	}
	as, ok := s.primary.(ratelimit.AtomicStore)
	if !ok {
		return fmt.Errorf("fallback: the primary store %T cannot decide several keys as one: %w", s.primary, errors.ErrUnsupported)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	parts := make([]*part, len(items))
	var gen uint64
	for i := range items {
		parts[i] = s.partition(ctx, items[i].Key)
		g := parts[i].gen.Load()
		if i == 0 {
			gen = g
		}
		if g&1 != 0 {
			return s.serveAll(ctx, items, parts[i], nil)
		}
	}
	pctx, cancel := s.withTimeout(ctx)
	err := as.ApplyAll(pctx, items)
	cancel()
	if err == nil {
		for _, p := range parts {
			p.answered.Add(1)
		}
		return nil
	}
	switch s.failure(ctx, parts[0], err) {
	case callerGaveUp, notOutage:
		return err
	case outage:
		s.down(ctx, parts[0], gen, err)
	}
	return s.serveAll(ctx, items, parts[0], err)
}

// serveAll answers an ApplyAll with the outage behaviour.
func (s *Store) serveAll(ctx context.Context, items []ratelimit.BatchItem, p *part, cause error) error {
	switch s.outage {
	case ratelimit.FailOpen, ratelimit.FailClosed:
		for i := range items {
			d, err := s.unchecked(items[i].Request, s.outage == ratelimit.FailOpen)
			if err != nil {
				return err
			}
			items[i].Decision = d
		}
		return nil
	case ratelimit.LocalFallback:
		local := make([]ratelimit.BatchItem, len(items))
		for i, it := range items {
			local[i] = ratelimit.BatchItem{Key: it.Key, Request: s.shared(it.Request)}
			if local[i].Request.Now.IsZero() {
				local[i].Request.Now = s.clock()
			}
			for _, l := range local[i].Request.Limits {
				if !it.Request.Peek && it.Request.Cost > l.Capacity {
					// The share can never hold the cost: the request is
					// denied as by empty shares, and nothing is taken.
					for i := range items {
						d, err := s.unchecked(items[i].Request, false)
						if err != nil {
							return err
						}
						d.Source = ratelimit.SourceLocal
						items[i].Decision = d
					}
					return nil
				}
			}
		}
		if ctx.Err() != nil {
			ctx = context.WithoutCancel(ctx)
		}
		la, ok := any(s.local).(ratelimit.AtomicStore)
		if !ok {
			return fmt.Errorf("fallback: local store cannot decide several keys as one: %w", errors.ErrUnsupported)
		}
		if err := la.ApplyAll(ctx, local); err != nil {
			return err
		}
		for i := range items {
			items[i].Decision = local[i].Decision
			items[i].Decision.Source = ratelimit.SourceLocal
		}
		return nil
	}
	if cause != nil {
		return fmt.Errorf("%w: %w", ErrUnavailable, cause)
	}
	return p.unavailable()
}

// shared returns r with each limit replaced by its fleet share.
func (s *Store) shared(r ratelimit.Request) ratelimit.Request {
	if s.share <= 1 {
		return r
	}
	limits := make([]ratelimit.Limit, len(r.Limits))
	for i, l := range r.Limits {
		limits[i] = Share(l, s.share)
	}
	r.Limits = limits
	return r
}
