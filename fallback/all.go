package fallback

import (
	"context"
	"errors"
	"fmt"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/tokenbucket"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyAll decides items as one, all or nothing (see ratelimit.BatchStore),
// through the primary while every item's partition is alive, and with the
// outage behaviour otherwise: LocalFallback decides them as one on the local
// buckets (under the fleet share), FailOpen admits them all, FailClosed
// denies them all, and ReturnError returns an error wrapping ratelimit.ErrUnavailable.
// A primary call that fails with an unreachable error marks the first item's
// partition down. The primary must be a ratelimit.BatchStore (memstore and
// redisstore are); otherwise ApplyAll returns an error wrapping
// errors.ErrUnsupported and decides nothing.
func (s *Store) ApplyAll(ctx context.Context, items []ratelimit.BatchItem) error {
	if err := tokenbucket.ValidateAll(items); err != nil {
		return err
	}
	if len(items) == 0 {
		return nil
	}
	as, ok := s.primary.(ratelimit.BatchStore)
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
	case FailOpen, FailClosed:
		for i := range items {
			d, err := s.unchecked(items[i].Request, s.outage == FailOpen)
			if err != nil {
				return err
			}
			items[i].Decision = d
		}
		return nil
	case LocalFallback:
		local := make([]ratelimit.BatchItem, len(items))
		for i, it := range items {
			local[i] = ratelimit.BatchItem{Key: it.Key, Request: s.shared(it.Request)}
			if local[i].Request.Now.IsZero() {
				local[i].Request.Now = s.clock()
			}
		}
		for i, it := range items {
			if _, denied, err := s.beyondShare(it.Request, local[i].Request); err != nil {
				return err
			} else if denied {
				// One item can never pass under the share: the request is
				// denied as by empty shares, and nothing is taken.
				for j := range items {
					d, denied, err := s.beyondShare(items[j].Request, local[j].Request)
					if err == nil && !denied {
						d, err = s.unchecked(local[j].Request, false)
						d.Source = ratelimit.SourceLocal
					}
					if err != nil {
						return err
					}
					items[j].Decision = d
				}
				return nil
			}
		}
		if ctx.Err() != nil {
			ctx = context.WithoutCancel(ctx)
		}
		la, ok := any(s.local).(ratelimit.BatchStore)
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
		return wrapUnavailable(cause)
	}
	return p.unavailable()
}
