package redisstore

import (
	"context"
	"errors"
	"strings"

	"github.com/exactlimit/ratelimit/internal/script"
	"github.com/redis/go-redis/v9"
)

// The script runs as a function where the server has functions (Redis 7
// and later): FCALL of script.Function, whose library the first call that
// finds it missing loads on its key's master (FUNCTION LOAD; a server keeps
// its functions across restarts and gives them to its replicas). A library
// makes the script's helpers and decoded policies once, where EVAL makes
// them on every call: some 15% of Redis's instructions per decision of one
// key (docs/performance.md). Elsewhere (Redis 6, an ACL without FCALL or
// FUNCTION) the Store turns to EVALSHA, and to EVAL of the body when the
// server has not cached the script (NOSCRIPT), for the rest of its life.

// run returns the command that runs the script on keys with args through c,
// the Store's client or a pipeline of it: FCALL, or without functions
// EVALSHA, or EVAL of the body when again is true (after NOSCRIPT).
func (s *Store) run(ctx context.Context, c redis.Cmdable, keys []string, args []any, again bool) *redis.Cmd {
	switch {
	case !s.noFunctions.Load():
		return c.FCall(ctx, script.Function, keys, args...)
	case again:
		return c.Eval(ctx, script.Source, keys, args...)
	}
	return c.EvalSha(ctx, script.SHA, keys, args...)
}

// rerun completes a call of the script on keys with args whose first try
// gave res and err: when the server did not hold the script, ready makes it
// and the call is sent once more, by itself.
func (s *Store) rerun(ctx context.Context, keys []string, args []any, res any, err error) (any, error) {
	again, err := s.ready(ctx, keys[0], err)
	if !again {
		return res, err
	}
	return s.run(ctx, s.client, keys, args, true).Result()
}

// notRun reports whether err says the script did not run because the
// server lacks it (the cases ready handles).
func notRun(err error) bool {
	return err != nil && (redis.HasErrorPrefix(err, "NOSCRIPT") || redis.HasErrorPrefix(err, "Function not found") || noFCall(err))
}

// ready reads err, the error of a call of the script on key (nil included).
// When err says the script did not run because the server lacks it, ready
// makes the server able to run it (it loads the library on key's master, or
// turns the Store to scripts) and reports true: the call is to be sent again,
// by run with again true. Otherwise it reports false and err, or the error
// that kept the library from loading.
func (s *Store) ready(ctx context.Context, key string, err error) (bool, error) {
	switch {
	case err == nil:
		return false, nil
	case redis.HasErrorPrefix(err, "NOSCRIPT"):
		return true, nil
	case redis.HasErrorPrefix(err, "Function not found"):
		lerr := s.load(ctx, key)
		var refused redis.Error
		switch {
		case lerr == nil:
			return true, nil
		case errors.As(lerr, &refused):
			s.noFunctions.Store(true)
			return true, nil
		}
		return false, lerr
	case noFCall(err):
		s.noFunctions.Store(true)
		return true, nil
	}
	return false, err
}

// noFCall reports whether err is a server's refusal of FCALL itself: a
// server without functions, or an ACL that denies the command.
func noFCall(err error) bool {
	if !redis.HasErrorPrefix(err, "unknown command") && !redis.HasErrorPrefix(err, "NOPERM") {
		return false
	}
	return strings.Contains(strings.ToLower(err.Error()), "fcall")
}

// serverOf returns the client of the server that serves key: its master on
// Cluster, its shard on a Ring, else the Store's client.
func (s *Store) serverOf(ctx context.Context, key string) (redis.Cmdable, error) {
	switch client := s.client.(type) {
	case *redis.ClusterClient:
		return client.MasterForKey(ctx, key)
	case *redis.Ring:
		return client.GetShardClientForKey(key)
	}
	return s.client, nil
}

// load loads the script's library on the server that serves key; one that
// holds it already (another process loaded it first) is no error.
func (s *Store) load(ctx context.Context, key string) error {
	c, err := s.serverOf(ctx, key)
	if err != nil {
		return err
	}
	err = c.FunctionLoad(ctx, script.Library).Err()
	if err != nil && redis.HasErrorPrefix(err, "Library") && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}
