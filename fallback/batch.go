package fallback

import (
	"context"

	"github.com/exactlimit/ratelimit"
)

var _ ratelimit.BatchStore = (*Store)(nil)

// ApplyBatch decides every item as Apply would. The items whose primary (or
// partition) is alive go to it in one ApplyBatch call when it is a
// ratelimit.BatchStore, and in one Apply each, in order, otherwise. An item
// that fails with an unreachable error marks its partition down and is
// answered by the outage behaviour; the items of a partition that is already
// down are answered by it at once, without being sent. Invalid items get an
// error wrapping ratelimit.ErrInvalidArgument and are not sent. Items on the
// same key are decided in input order.
func (s *Store) ApplyBatch(ctx context.Context, items []ratelimit.BatchItem) {
	for i := range items {
		items[i].Decision, items[i].Err = ratelimit.Decision{}, items[i].Request.Validate()
	}
	bs, ok := s.primary.(ratelimit.BatchStore)
	if !ok {
		for i := range items {
			if it := &items[i]; it.Err == nil {
				it.Decision, it.Err = s.Apply(ctx, it.Key, it.Request)
			}
		}
		return
	}
	if err := ctx.Err(); err != nil {
		for i := range items {
			if items[i].Err == nil {
				items[i].Err = err
			}
		}
		return
	}
	type sent struct {
		idx int
		p   *part
		gen uint64
	}
	var batch []ratelimit.BatchItem
	var meta []sent
	for i := range items {
		it := &items[i]
		if it.Err != nil {
			continue
		}
		p := s.partition(ctx, it.Key)
		gen := p.gen.Load()
		if gen&1 != 0 {
			it.Decision, it.Err = s.serve(ctx, "", it.Key, it.Request, p, nil)
			continue
		}
		batch = append(batch, ratelimit.BatchItem{Key: it.Key, Request: it.Request})
		meta = append(meta, sent{i, p, gen})
	}
	if len(batch) == 0 {
		return
	}
	pctx, cancel := s.withTimeout(ctx)
	bs.ApplyBatch(pctx, batch)
	cancel()
	for j, b := range batch {
		m := meta[j]
		it := &items[m.idx]
		switch {
		case b.Err == nil:
			m.p.answered.Add(1)
			it.Decision = b.Decision
		default:
			switch s.failure(ctx, m.p, b.Err) {
			case callerGaveUp, notOutage:
				it.Err = b.Err
				continue
			case callerDeadline:
				it.Decision, it.Err = s.serve(ctx, "", it.Key, it.Request, m.p, b.Err)
				continue
			}
			s.down(ctx, m.p, m.gen, b.Err)
			it.Decision, it.Err = s.serve(ctx, "", it.Key, it.Request, m.p, b.Err)
		}
	}
}
