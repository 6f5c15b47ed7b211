package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
)

// coalescer is the queue of one master (of the server, without Cluster). It
// keeps up to Store.lanes checks or pipelines of checks in flight, each on a
// connection of its own. A check that finds a lane free is sent at once by
// its own goroutine, so a lone caller pays nothing for coalescing. A check
// that finds every lane busy waits in the queue, and when a lane comes free
// the whole queue (up to maxBatch) goes out in one pipeline, sent by a
// goroutine that lives while the queue has work; in it, checks of one time
// (and on Cluster of one slot) share script calls of up to maxKeys keys, each
// key decided on its own (see Store.calls).
//
// Isolation: each master has its own queue, so a master that hangs holds
// back only its own subjects. A caller waits on its own context: one that
// gives up before its check is sent leaves the queue and consumes nothing,
// and a slow reply holds back only the lane it came on. A panic in a check
// releases its lane; a panic in a batch becomes an error for that batch's
// callers.
type coalescer struct {
	mu       sync.Mutex
	inflight int // lanes in use
	queue    []*call
}

// call is a check waiting in a queue.
type call struct {
	ctx      context.Context
	item     ratelimit.BatchItem
	deadline time.Time // zero: none
	done     chan struct{}
	sent     bool // under coalescer.mu: taken into a batch
}

// coalescerFor returns the queue of the master that serves key.
func (s *Store) coalescerFor(ctx context.Context, key string) *coalescer {
	if s.cluster == nil {
		return &s.single
	}
	addr := s.partition(ctx, key)
	if c, ok := s.masters.Load(addr); ok {
		return c.(*coalescer)
	}
	c, _ := s.masters.LoadOrStore(addr, new(coalescer))
	return c.(*coalescer)
}

func (s *Store) applyCoalesced(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	c := s.coalescerFor(ctx, key)
	c.mu.Lock()
	if c.inflight < s.lanes {
		c.inflight++
		c.mu.Unlock()
		defer s.release(c)
		return s.apply(ctx, key, r)
	}
	cl := &call{ctx: ctx, item: ratelimit.BatchItem{Key: key, Request: r}, done: make(chan struct{})}
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
		}
		// Either it never left, or it is on the wire and may be decided;
		// the caller has stopped waiting for the answer.
		c.mu.Unlock()
		return ratelimit.Decision{}, wrapErr("check", key, ctx.Err())
	}
}

// release ends a lane's turn: with checks queued the lane carries them on,
// in a goroutine of its own; else it comes free.
func (s *Store) release(c *coalescer) {
	c.mu.Lock()
	batch := c.take()
	if batch == nil {
		c.inflight--
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	go s.flush(c, batch)
}

// take removes up to maxBatch queued checks and marks them sent; nil when
// the queue is empty. c.mu must be held.
func (c *coalescer) take() []*call {
	if len(c.queue) == 0 {
		return nil
	}
	n := min(len(c.queue), maxBatch)
	batch := make([]*call, n)
	copy(batch, c.queue)
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	for _, cl := range batch {
		cl.sent = true
	}
	return batch
}

// flush sends batch, and then each batch queued meanwhile, until the queue
// is empty and the lane comes free.
func (s *Store) flush(c *coalescer, batch []*call) {
	for batch != nil {
		s.send(batch)
		c.mu.Lock()
		batch = c.take()
		if batch == nil {
			c.inflight--
		}
		c.mu.Unlock()
	}
}

// send runs one batch as a pipeline and hands each caller its result. The
// pipeline runs with the values of its first caller's context (so that
// tracing hooks see a caller's span) until the latest deadline among its
// callers, or without a deadline when one of them has none (the client's own
// timeouts bound it then).
func (s *Store) send(batch []*call) {
	defer func() {
		if v := recover(); v != nil {
			err := fmt.Errorf("ratelimit: redis check: panic in a pipeline: %v", v)
			for _, cl := range batch {
				if cl.item.Err == nil && cl.item.Decision == (ratelimit.Decision{}) {
					cl.item.Err = err
				}
			}
		}
		for _, cl := range batch {
			close(cl.done)
		}
	}()
	var latest time.Time
	unbounded := false
	for _, cl := range batch {
		if cl.deadline.IsZero() {
			unbounded = true
		} else if cl.deadline.After(latest) {
			latest = cl.deadline
		}
	}
	ctx := context.WithoutCancel(batch[0].ctx)
	if !unbounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	items := make([]*ratelimit.BatchItem, len(batch))
	for i, cl := range batch {
		items[i] = &cl.item
	}
	s.pipeline(ctx, items)
}
