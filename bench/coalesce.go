package main

import (
	"context"
	"fmt"
	"sync"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/redisstore"
	"github.com/redis/go-redis/v9"
)

// CoalescingStore is a prototype ratelimit.Store over go-redis that coalesces
// concurrent checks into pipelines, to measure what automatic batching in
// redisstore would gain.
//
// At most flushers round trips are in flight at once. A check that finds a
// free slot runs alone, as redisstore does (one EVALSHA, so an idle store
// adds no latency). A check that finds every slot busy is queued; when a
// round trip ends and checks are queued, its slot goes on (in a goroutine
// that ends once the queue is empty) sending everything queued, up to
// maxBatch checks, as one pipeline of EVALSHAs. Every check is still its own
// script call, so each stays atomic and exact; the pipeline only shares the
// write and read system calls and the round trip.
//
// A check whose context ends while it is queued returns the context's error
// but is still sent with its batch (a prototype shortcut: a real store would
// drop it from the queue, or send it and not count it).
type CoalescingStore struct {
	client   redis.UniversalClient
	single   *redisstore.Store
	flushers int
	maxBatch int

	mu     sync.Mutex
	active int
	queue  []*call

	batches, batched int64 // for the report, guarded by mu
}

type call struct {
	key  string
	r    ratelimit.Request
	args []any
	d    ratelimit.Decision
	err  error
	done chan struct{}
}

// NewCoalescingStore returns a CoalescingStore over client with at most
// flushers round trips in flight and at most maxBatch checks per pipeline.
func NewCoalescingStore(client redis.UniversalClient, flushers, maxBatch int) *CoalescingStore {
	return &CoalescingStore{client: client, single: redisstore.New(client, redisstore.WithoutCoalescing()), flushers: max(1, flushers), maxBatch: max(1, maxBatch)}
}

// Apply decides r against the bucket at key, alone or in a pipeline with
// other concurrent checks.
func (s *CoalescingStore) Apply(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if err := r.Validate(); err != nil {
		return ratelimit.Decision{}, err
	}
	s.mu.Lock()
	if s.active < s.flushers {
		s.active++
		s.mu.Unlock()
		d, err := s.single.Apply(ctx, key, r)
		s.release()
		return d, err
	}
	c := &call{key: key, r: r, args: redisstore.Args(r), done: make(chan struct{})}
	s.queue = append(s.queue, c)
	s.mu.Unlock()
	select {
	case <-c.done:
		return c.d, c.err
	case <-ctx.Done():
		return ratelimit.Decision{}, ctx.Err()
	}
}

// Reset deletes the bucket at key.
func (s *CoalescingStore) Reset(ctx context.Context, key string) error {
	return s.single.Reset(ctx, key)
}

// Stats returns the number of pipelines sent and the checks they carried.
func (s *CoalescingStore) Stats() (batches, checks int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.batches, s.batched
}

// release gives up a round-trip slot, or hands it to a drain of the queue.
func (s *CoalescingStore) release() {
	s.mu.Lock()
	batch := s.take()
	if batch == nil {
		s.active--
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	go s.drain(batch)
}

func (s *CoalescingStore) drain(batch []*call) {
	for batch != nil {
		s.flush(batch)
		s.mu.Lock()
		batch = s.take()
		if batch == nil {
			s.active--
		}
		s.mu.Unlock()
	}
}

// take removes up to maxBatch queued calls. s.mu must be held.
func (s *CoalescingStore) take() []*call {
	n := min(len(s.queue), s.maxBatch)
	if n == 0 {
		return nil
	}
	var batch []*call
	if n == len(s.queue) {
		batch, s.queue = s.queue, nil
	} else {
		batch = append([]*call(nil), s.queue[:n]...)
		s.queue = append([]*call(nil), s.queue[n:]...)
	}
	s.batches++
	s.batched += int64(n)
	return batch
}

// flush sends batch as one pipeline of EVALSHAs, re-sends the checks that
// met NOSCRIPT as EVALs (they did not run, so nothing is spent twice), and
// hands every call its result.
func (s *CoalescingStore) flush(batch []*call) {
	ctx := context.Background()
	cmds := make([]*redis.Cmd, len(batch))
	pipe := s.client.Pipeline()
	for i, c := range batch {
		cmds[i] = pipe.EvalSha(ctx, redisstore.ScriptSHA, []string{c.key}, c.args...)
	}
	pipe.Exec(ctx)
	var again []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := s.client.Pipeline()
		for _, i := range again {
			cmds[i] = pipe.Eval(ctx, redisstore.Script, []string{batch[i].key}, batch[i].args...)
		}
		pipe.Exec(ctx)
	}
	for i, c := range batch {
		res, err := cmds[i].Result()
		if err == nil {
			c.d, err = redisstore.ParseReply(c.r, res)
		}
		if err != nil {
			c.err = fmt.Errorf("ratelimit: redis check of %q: %w", c.key, err)
		}
		close(c.done)
	}
}
