package redisstore

import (
	"context"

	"github.com/exactlimit/ratelimit"
	"github.com/exactlimit/ratelimit/internal/keyfmt"
	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// maxBatch is the most checks one pipeline carries (a group of more goes
// alone).
const maxBatch = 256

// maxKeys is the most checks one script call carries (a group of more goes
// alone). A call holds Redis for the whole of it, some 6 µs of its CPU per
// check: 16 keep a call near 100 µs, and a call of more saves little (the
// per-call cost is already spread over 16).
const maxKeys = 16

// A group is what a script call decides as one: a check of its own, or the
// items of one ApplyAll on one slot, all or nothing. Its items share their
// time (Request.Now) and, on Cluster, their slot; a call carries whole
// groups, each decided independently of the others, in order. A group's
// error is every one of its items' Err, with no Decision.
type group []*ratelimit.BatchItem

// ApplyBatch decides every item as Apply would, in pipelines of at most 256
// checks: on a standalone server one pipeline after another, and on Cluster
// one per master, run in parallel. Items decided at the same time (on
// Cluster, of the same slot as well) share script calls of up to 16 keys,
// each key decided on its own as one call of its own would decide it, in
// order: an item on a key named before sees that item's write. Calls a
// server did not hold the script for are sent again, once it does, in one
// more pipeline. The items are independent decisions, not a transaction, so some
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
	groups := make([]group, len(valid))
	for i := range valid {
		groups[i] = valid[i : i+1 : i+1]
	}
	s.pipeline(ctx, groups)
}

// pipeline runs the script calls of groups of valid items in pipelines of
// at most maxBatch keys, one after the other.
func (s *Store) pipeline(ctx context.Context, groups []group) {
	for len(groups) > 0 {
		n, keys := 0, 0
		for n < len(groups) && (n == 0 || keys+len(groups[n]) <= maxBatch) {
			keys += len(groups[n])
			n++
		}
		s.pipelineOnce(ctx, s.calls(groups[:n]))
		groups = groups[n:]
	}
}

// calls packs groups into script calls of at most maxKeys keys, in their
// order, never splitting a group (one of more keys is a call of its own):
// the groups of one call share their time (Request.Now) and, on Cluster,
// their slot.
func (s *Store) calls(groups []group) [][]group {
	type class struct {
		now  int64
		slot uint16
	}
	type open struct{ call, keys int }
	opened := map[class]open{} // the call of each class still taking groups
	var calls [][]group
	for _, g := range groups {
		var k class
		if now := g[0].Request.Now; !now.IsZero() {
			k.now = now.UnixMicro() + 1 // 0 stands for the server's TIME
		}
		if s.cluster != nil {
			k.slot = keyfmt.Slot(g[0].Key)
		}
		o, ok := opened[k]
		if !ok || o.keys+len(g) > maxKeys {
			o = open{call: len(calls)}
			calls = append(calls, make([]group, 0, min(maxKeys, len(groups))))
		}
		calls[o.call] = append(calls[o.call], g)
		o.keys += len(g)
		opened[k] = o
	}
	return calls
}

// callArgs returns the keys and ARGV of one script call of groups.
func (s *Store) callArgs(call []group) (keys []string, args []any) {
	n := 0
	for _, g := range call {
		n += len(g)
	}
	keys = make([]string, 0, n)
	args = script.CallArgs(call[0][0].Request, mode(call), n)
	most := 0 // the most limits and quotas of a request
	for _, g := range call {
		for _, it := range g {
			keys = append(keys, it.Key)
			args = s.enc.AppendRequest(args, it.Request)
			most = max(most, len(it.Request.Limits)+len(it.Request.Quotas))
		}
	}
	if n > 1 && most > 1 {
		args = append(args, int64(script.ReplyLen+2*most))
	}
	return keys, args
}

// mode is the script's mode for a call of groups: "each" when every group
// is one check, "all" for one group of several, else the groups' sizes.
func mode(call []group) string {
	single := true
	for _, g := range call {
		single = single && len(g) == 1
	}
	switch {
	case single:
		return script.Each
	case len(call) == 1:
		return script.All
	}
	sizes := make([]int, len(call))
	for i, g := range call {
		sizes[i] = len(g)
	}
	return script.Groups(sizes)
}

// pipelineOnce sends calls, each one script call on its groups' keys, in one
// pipeline, and gives each group its decisions or its error.
func (s *Store) pipelineOnce(ctx context.Context, calls [][]group) {
	cmds := make([]*redis.Cmd, len(calls))
	keys := make([][]string, len(calls))
	args := make([][]any, len(calls))
	pipe := s.client.Pipeline()
	for i, call := range calls {
		keys[i], args[i] = s.callArgs(call)
		cmds[i] = s.run(ctx, pipe, keys[i], args[i], false)
	}
	pipe.Exec(ctx) // each command carries its own error
	// A call that did not run is sent again once ready has made its server
	// hold the script: once per server of the pipeline (a Cluster or Ring
	// pipeline spans several), not once per call.
	var again []int
	var readied map[redis.Cmdable]bool
	for i, cmd := range cmds {
		if !notRun(cmd.Err()) {
			continue
		}
		srv, serr := s.serverOf(ctx, keys[i][0])
		if serr == nil && readied[srv] {
			again = append(again, i)
		} else if ok, err := s.ready(ctx, keys[i][0], cmd.Err()); !ok {
			cmd.SetErr(err)
		} else {
			again = append(again, i)
			if serr == nil {
				if readied == nil {
					readied = map[redis.Cmdable]bool{}
				}
				readied[srv] = true
			}
		}
	}
	if len(again) > 0 {
		pipe := s.client.Pipeline()
		for _, i := range again {
			cmds[i] = s.run(ctx, pipe, keys[i], args[i], true)
		}
		pipe.Exec(ctx)
	}
	for i, call := range calls {
		res, err := cmds[i].Result()
		decideCall(call, len(keys[i]), res, err)
	}
}

// evalGroup decides g in one script call of its own (not a pipeline).
func (s *Store) evalGroup(ctx context.Context, g group) {
	call := []group{g}
	keys, args := s.callArgs(call)
	res, err := s.eval(ctx, keys, args)
	decideCall(call, len(keys), res, err)
}

// decideCall gives each group of a script call of nkeys keys its result:
// from the call's reply res, or the call's error err.
func decideCall(call []group, nkeys int, res any, err error) {
	var rp script.Reply
	if err == nil {
		rp, err = script.ParseCall(res, nkeys)
	}
	j := 0 // the key of the call
	for _, g := range call {
		if err != nil {
			fail(g, wrapErr("check", g[0].Key, err))
			continue
		}
		for i, it := range g {
			d, err := rp.Decision(it.Request, j+i)
			if err != nil {
				fail(g, wrapErr("check", it.Key, err))
				break
			}
			it.Decision, it.Err = d, nil
		}
		j += len(g)
	}
}

// fail gives every item of g the error err and no decision.
func fail(g group, err error) {
	for _, it := range g {
		it.Decision, it.Err = ratelimit.Decision{}, err
	}
}
