package redisstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// coalescer is the queue of one master (of the server, without Cluster). It
// keeps up to Store.lanes script calls or pipelines of them in flight, each
// on a connection of its own. A call that finds a lane free is sent at once
// by its own goroutine, so a lone caller pays nothing for coalescing. A call
// that finds every lane busy waits in the queue, and when a lane comes free
// the whole queue (up to maxBatch keys) goes out in one pipeline, sent by a
// goroutine that lives while the queue has work; in it, the queued checks
// and all-or-nothing groups (see group) of one time, and on Cluster of one
// slot, share script calls of up to maxKeys keys, each decided on its own
// (see Store.calls).
//
// Isolation: each master has its own queue, so a master that hangs holds
// back only its own subjects. A caller waits on its own context: one that
// gives up before its call is sent leaves the queue and consumes nothing,
// and a slow reply holds back only the lane it came on. A panic in a call
// releases its lane; a panic in a batch becomes an error for that batch's
// callers.
type coalescer struct {
	mu       sync.Mutex
	inflight int // lanes in use
	queue    []*call
}

// call is a check, or a group of an ApplyAll, waiting in a queue. It owns
// its items: a caller that stops waiting leaves them to the batch.
type call struct {
	ctx      context.Context
	items    []ratelimit.BatchItem // a check (one's own) or a group
	one      [1]ratelimit.BatchItem
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
	if c.lane(s.lanes) {
		defer s.release(c)
		return s.applyLone(ctx, key, r)
	}
	cl := &call{}
	cl.one[0] = ratelimit.BatchItem{Key: key, Request: r}
	cl.items = cl.one[:]
	if err := c.wait(ctx, cl); err != nil {
		return ratelimit.Decision{}, wrapErr("check", key, err)
	}
	return cl.items[0].Decision, cl.items[0].Err
}

// applyLone sends one check on a free lane, as apply does, with the FCALL
// command made whole in one slice (see script.Encoder.FCall) rather than
// copied by the client's FCall from the keys and arguments, and the reply
// read where it lies. Without functions it is apply.
func (s *Store) applyLone(ctx context.Context, key string, r ratelimit.Request) (ratelimit.Decision, error) {
	if s.noFunctions.Load() {
		return s.apply(ctx, key, r)
	}
	cmd := redis.NewCmd(ctx, s.enc.FCall(key, r)...)
	cmd.SetFirstKeyPos(3)
	_ = s.client.Process(ctx, cmd)
	res, err := cmd.Result()
	if err != nil {
		// The server may not hold the library yet: rerun loads it and
		// sends the call again.
		res, err = s.rerun(ctx, []string{key}, cmd.Args()[4:], res, err)
	}
	var d ratelimit.Decision
	if err == nil {
		d, _, err = script.ParseSettle(r, res)
	}
	if err != nil {
		return ratelimit.Decision{}, wrapErr("check", key, err)
	}
	return d, nil
}

// applyGroup decides g, valid items of one slot, all or nothing in one
// script call: through its master's lanes as a check goes, or on its own
// without coalescing. It returns the group's error, leaving every item's
// Err nil.
func (s *Store) applyGroup(ctx context.Context, g group) error {
	if !s.coalesce {
		s.evalGroup(ctx, g)
	} else if c := s.coalescerFor(ctx, g[0].Key); c.lane(s.lanes) {
		func() {
			defer s.release(c) // a panic too releases the lane
			s.evalGroup(ctx, g)
		}()
	} else {
		cl := &call{items: make([]ratelimit.BatchItem, len(g))}
		for i, it := range g {
			cl.items[i] = *it
		}
		if err := c.wait(ctx, cl); err != nil {
			return wrapErr("check", g[0].Key, err)
		}
		for i, it := range g {
			it.Decision, it.Err = cl.items[i].Decision, cl.items[i].Err
		}
	}
	err := g[0].Err
	for _, it := range g {
		it.Err = nil
	}
	return err
}

// lane takes a free lane of c for the caller, who releases it, and reports
// true; or, when every lane is busy, reports false with c.mu held, for the
// caller to wait in the queue.
func (c *coalescer) lane(lanes int) bool {
	c.mu.Lock()
	if c.inflight < lanes {
		c.inflight++
		c.mu.Unlock()
		return true
	}
	return false
}

// wait queues cl on c, whose mu the caller holds (see lane), and returns
// when cl is decided, or with ctx's error when ctx ends first: then a call
// still in the queue leaves it and takes nothing, and one already sent may
// be decided, with no one to hear it.
func (c *coalescer) wait(ctx context.Context, cl *call) error {
	cl.ctx, cl.done = ctx, make(chan struct{})
	cl.deadline, _ = ctx.Deadline()
	c.queue = append(c.queue, cl)
	c.mu.Unlock()

	select {
	case <-cl.done:
		return nil
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
		c.mu.Unlock()
		return ctx.Err()
	}
}

// release ends a lane's turn: with calls queued the lane carries them on,
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

// take removes queued calls of up to maxBatch keys in all (at least one
// call) and marks them sent; nil when the queue is empty. c.mu must be held.
func (c *coalescer) take() []*call {
	n, keys := 0, 0
	for n < len(c.queue) && (n == 0 || keys+len(c.queue[n].items) <= maxBatch) {
		keys += len(c.queue[n].items)
		n++
	}
	if n == 0 {
		return nil
	}
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
				for _, it := range cl.items {
					if it.Err == nil && undecided(it.Decision) {
						// Not decided whole: the call fails.
						for i := range cl.items {
							cl.items[i].Decision, cl.items[i].Err = ratelimit.Decision{}, err
						}
						break
					}
				}
			}
		}
		for _, cl := range batch {
			close(cl.done)
		}
	}()
	var latest time.Time
	unbounded := false
	keys := 0
	for _, cl := range batch {
		keys += len(cl.items)
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
	items := make([]*ratelimit.BatchItem, 0, keys)
	groups := make([]group, len(batch))
	for i, cl := range batch {
		for j := range cl.items {
			items = append(items, &cl.items[j])
		}
		groups[i] = items[len(items)-len(cl.items) : len(items) : len(items)]
	}
	s.pipeline(ctx, groups)
}

// undecided reports whether d is no decision of the script's: an item a
// pipeline that panicked did not decide. Every decision names its binding
// limit, or, when a quota bound it, has the standings of its policy.
func undecided(d ratelimit.Decision) bool {
	return d.Limit == (ratelimit.Limit{}) && d.Standings == nil
}
