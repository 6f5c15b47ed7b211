package redisstore

import (
	"context"

	"github.com/exactlimit/ratelimit"
)

// ApplyGroups decides groups, each valid and all or nothing, as the
// coalescer sends a queue of them: in pipelines of shared script calls (see
// Store.pipeline). A group's error is every one of its items' Err.
func (s *Store) ApplyGroups(ctx context.Context, groups [][]ratelimit.BatchItem) {
	gs := make([]group, len(groups))
	for i := range groups {
		gs[i] = groupOf(groups[i], nil)
	}
	s.pipeline(ctx, gs)
}

// Busy reports the lanes in use and the calls queued on a single server's
// queue.
func (s *Store) Busy() (lanes, queued int) {
	s.single.mu.Lock()
	defer s.single.mu.Unlock()
	return s.single.inflight, len(s.single.queue)
}
