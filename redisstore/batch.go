package redisstore

import (
	"context"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// maxBatch is the most checks one pipeline carries.
const maxBatch = 256

// maxKeys is the most checks one script call carries. A call holds Redis
// for the whole of it, some 6 µs of its CPU per check: 16 keep a call near
// 100 µs, and a call of more saves little (the per-call cost is already
// spread over 16).
const maxKeys = 16

// ApplyBatch decides every item as Apply would, in pipelines of at most 256
// checks: on a standalone server one pipeline after another, and on Cluster
// one per master, run in parallel. Items decided at the same time (on
// Cluster, of the same slot as well) share script calls of up to 16 keys,
// each key decided on its own as one call of its own would decide it, in
// order: an item on a key named before sees that item's write. Calls the
// server had no cached script for are sent again as EVAL in one more
// pipeline. The items are independent decisions, not a transaction, so some
// may be decided while others carry an error (a master that is down, or a
// malformed bucket, say).
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
		s.pipelineOnce(ctx, s.calls(items[:n]))
		items = items[n:]
	}
}

// calls groups items into script calls of at most maxKeys, in their order:
// items of one call share their time (Request.Now) and, on Cluster, their
// slot.
func (s *Store) calls(items []*ratelimit.BatchItem) [][]*ratelimit.BatchItem {
	type group struct {
		now  int64
		slot uint16
	}
	open := map[group]int{} // the call of each group still taking items
	var calls [][]*ratelimit.BatchItem
	for _, it := range items {
		var g group
		if !it.Request.Now.IsZero() {
			g.now = it.Request.Now.UnixMicro() + 1 // 0 stands for the server's TIME
		}
		if s.cluster != nil {
			g.slot = keyfmt.Slot(it.Key)
		}
		c, ok := open[g]
		if !ok || len(calls[c]) == maxKeys {
			c = len(calls)
			open[g] = c
			calls = append(calls, make([]*ratelimit.BatchItem, 0, min(maxKeys, len(items))))
		}
		calls[c] = append(calls[c], it)
	}
	return calls
}

// pipelineOnce sends calls, each one script call on its items' keys, in one
// pipeline, and gives each item its decision or its error.
func (s *Store) pipelineOnce(ctx context.Context, calls [][]*ratelimit.BatchItem) {
	cmds := make([]*redis.Cmd, len(calls))
	keys := make([][]string, len(calls))
	args := make([][]any, len(calls))
	pipe := s.client.Pipeline()
	for i, call := range calls {
		keys[i] = make([]string, len(call))
		args[i] = script.CallArgs(call[0].Request, script.Each, len(call))
		for j, it := range call {
			keys[i][j] = it.Key
			args[i] = s.enc.AppendRequest(args[i], it.Request)
		}
		cmds[i] = pipe.EvalSha(ctx, script.SHA, keys[i], args[i]...)
	}
	pipe.Exec(ctx) // each command carries its own error
	var again []int
	for i, cmd := range cmds {
		if noScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) > 0 {
		pipe := s.client.Pipeline()
		for _, i := range again {
			cmds[i] = pipe.Eval(ctx, script.Source, keys[i], args[i]...)
		}
		pipe.Exec(ctx)
	}
	for i, call := range calls {
		res, err := cmds[i].Result()
		var entries []any
		if err == nil {
			entries, err = script.Entries(res, len(call))
		}
		for j, it := range call {
			d, err := it.Decision, err
			if err == nil {
				d, err = script.ParseAt(it.Request, entries[j], res)
			}
			if err != nil {
				it.Decision, it.Err = ratelimit.Decision{}, wrapErr("check", it.Key, err)
			} else {
				it.Decision, it.Err = d, nil
			}
		}
	}
}
