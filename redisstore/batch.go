package redisstore

import (
	"context"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/redis/go-redis/v9"
)

// maxBatch is the most checks one pipeline carries.
const maxBatch = 256

// ApplyBatch decides every item in one round trip: one pipeline of script
// calls on a standalone server, and on Cluster one pipeline per master, run in
// parallel. Items the server had no cached script for are sent again as EVAL
// in one more pipeline. Each item is decided as Apply would decide it; the
// items are independent decisions, not a transaction, so some may be decided
// while others carry an error (a master that is down, say).
func (s *Store) ApplyBatch(ctx context.Context, items []ratelimit.BatchItem) {
	valid := make([]*ratelimit.BatchItem, 0, len(items))
	for i := range items {
		it := &items[i]
		it.Decision, it.Err = ratelimit.Decision{}, it.Request.Validate()
		if it.Err == nil {
			valid = append(valid, it)
		}
	}
	s.pipeline(ctx, valid)
}

// pipeline runs valid items' scripts in pipelines of at most maxBatch.
func (s *Store) pipeline(ctx context.Context, items []*ratelimit.BatchItem) {
	for len(items) > 0 {
		n := min(len(items), maxBatch)
		s.pipelineOnce(ctx, items[:n])
		items = items[n:]
	}
}

func (s *Store) pipelineOnce(ctx context.Context, items []*ratelimit.BatchItem) {
	cmds := make([]*redis.Cmd, len(items))
	pipe := s.client.Pipeline()
	for i, it := range items {
		cmds[i] = pipe.EvalSha(ctx, ScriptSHA, []string{it.Key}, Args(it.Request)...)
	}
	pipe.Exec(ctx) // each command carries its own error
	var again []int
	for i, cmd := range cmds {
		if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := s.client.Pipeline()
		for _, i := range again {
			cmds[i] = pipe.Eval(ctx, Script, []string{items[i].Key}, Args(items[i].Request)...)
		}
		pipe.Exec(ctx)
	}
	for i, it := range items {
		res, err := cmds[i].Result()
		if err == nil {
			it.Decision, err = ParseReply(it.Request, res)
		}
		if err != nil {
			it.Err = wrapErr("check", it.Key, err)
		}
	}
}

// coalescer gathers the checks that arrive while one is in flight and sends
// them together, in one pipeline, when it returns: under concurrency the
// store makes one round trip for many checks instead of one each. A check
// that finds nothing in flight is sent at once, by its own goroutine, so a
// lone caller pays nothing for it. The goroutine that flushes a gathered
// batch lives only while there is work, and each caller waits on its own
// context: one that gives up before its check is sent leaves the queue and
// consumes nothing.
type coalescer struct {
	mu    sync.Mutex
	busy  bool
	queue []*call
}

type call struct {
	item     ratelimit.BatchItem
	deadline time.Time // zero: none
	done     chan struct{}
	sent     bool // under coalescer.mu: taken into a batch
}

func (s *Store) applyCoalesced(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	c := &s.batch
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		d, err := s.apply(ctx, key, r)
		s.release()
		return d, err
	}
	cl := &call{item: ratelimit.BatchItem{Key: key, Request: r}, done: make(chan struct{})}
	cl.deadline, _ = ctx.Deadline()
	c.queue = append(c.queue, cl)
	c.mu.Unlock()

	select {
	case <-cl.done:
		return cl.item.Decision, cl.item.Err
	case <-ctx.Done():
		c.mu.Lock()
		if !cl.sent {
			for i, q := range c.queue {
				if q == cl {
					c.queue = append(c.queue[:i], c.queue[i+1:]...)
					break
				}
			}
			c.mu.Unlock()
			return ratelimit.Decision{}, wrapErr("check", key, ctx.Err())
		}
		c.mu.Unlock()
		// The check is on the wire and may be decided; the caller has
		// stopped waiting for the answer.
		return ratelimit.Decision{}, wrapErr("check", key, ctx.Err())
	}
}

// release ends the in-flight turn: with checks queued it starts a flush of
// them, else it marks the store idle.
func (s *Store) release() {
	c := &s.batch
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.busy = false
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	go s.flushLoop()
}

// flushLoop sends the queued checks in pipelines until the queue is empty.
func (s *Store) flushLoop() {
	c := &s.batch
	for {
		c.mu.Lock()
		if len(c.queue) == 0 {
			c.busy = false
			c.mu.Unlock()
			return
		}
		n := min(len(c.queue), maxBatch)
		batch := make([]*call, n)
		copy(batch, c.queue)
		c.queue = append(c.queue[:0], c.queue[n:]...)
		var latest time.Time
		unbounded := false
		for _, cl := range batch {
			cl.sent = true
			if cl.deadline.IsZero() {
				unbounded = true
			} else if cl.deadline.After(latest) {
				latest = cl.deadline
			}
		}
		c.mu.Unlock()

		// The batch outlives no caller that still waits: it runs until
		// the latest deadline among them (the client's own timeouts bound
		// it when one has none).
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if !unbounded {
			ctx, cancel = context.WithDeadline(ctx, latest)
		}
		items := make([]*ratelimit.BatchItem, n)
		for i, cl := range batch {
			items[i] = &cl.item
		}
		s.pipeline(ctx, items)
		cancel()
		for _, cl := range batch {
			close(cl.done)
		}
	}
}
