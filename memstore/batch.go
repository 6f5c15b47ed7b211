package memstore

import (
	"context"

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
