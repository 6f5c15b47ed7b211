package redisstore

import (
	"context"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// maxBatch is the most checks one pipeline carries.
const maxBatch = 256

// ApplyBatch decides every item as Apply would, in pipelines of at most 256
// checks: on a standalone server one pipeline after another, and on Cluster
// one per master, run in parallel. Items the server had no cached script for
// are sent again as EVAL in one more pipeline. The items are independent
// decisions, not a transaction, so some may be decided while others carry an
// error (a master that is down, say).
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
	keys := make([]string, len(items))
	pipe := s.client.Pipeline()
	for i, it := range items {
		keys[i] = it.Key
		cmds[i] = pipe.EvalSha(ctx, script.SHA, keys[i:i+1], s.enc.Args(it.Request)...)
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
			cmds[i] = pipe.Eval(ctx, script.Source, keys[i:i+1], s.enc.Args(items[i].Request)...)
		}
		pipe.Exec(ctx)
	}
	for i, it := range items {
		res, err := cmds[i].Result()
		if err == nil {
			it.Decision, err = script.ParseReply(it.Request, res)
		}
		if err != nil {
			it.Err = wrapErr("check", it.Key, err)
		}
	}
}
